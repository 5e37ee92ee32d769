"""The chaos report's overlapping-runs analysis (tests/chaos/report.py), on
synthetic handler records, faults and worker logs: no database, and no
process but the host-stall sentinel's.

Two runs of one job may overlap only when the older run's process was
stopped (SIGSTOP) and, for an async handler, the run ended within 100 ms of
the SIGCONT, or when the older run is a sync handler its worker abandoned.

A recurring schedule's occurrences (rows with ``recurring`` set) must fall
on its cron's grid, once per fire time, with none missing between its
registration and its removal, and each must run, never before its fire time.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.faults import FaultEvent
from tests.chaos.procs import Life
from tests.chaos.records import Run, read_runs
from tests.chaos.report import (
    Occurrence,
    Row,
    analyse,
    check_schedule,
    find_overlaps,
    fire_time,
    process_deaths,
    render,
    unattended_spans,
    worker_log_marks,
)
from tests.chaos.stalls import HostClock, HostStall, read_stalls
from tests.chaos.workload import Plan, Recurring

JOB = "01m8rjk1723gqtq0t5q2pach91"
OTHER = "01m8rjk1bv3bq84bveaqg9z74h"
OLD, NEW, THIRD = 1001, 1002, 1003


def run(
    attempt: int,
    pid: int,
    start: float,
    end: float | None = None,
    outcome: str | None = None,
    kind: str = "work",
    job_id: str = JOB,
) -> Run:
    if end is not None and outcome is None:
        outcome = "ok"
    return Run(job_id, attempt, pid, start, kind, 7, end, outcome)


def pause(index: int, pid: int, start: float, end: float) -> FaultEvent:
    return FaultEvent(index, "pause", start, end, pid, f"SIGSTOP pid {pid}")


def kill(index: int, pid: int, at: float) -> FaultEvent:
    return FaultEvent(index, "kill", at, at + 0.5, pid, f"pid {pid} killed")


def log_line(phrase: str) -> str:
    return f"2026-12-01 10:32:16,421 WARNING later_django.worker.server: {phrase}; more text\n"


def overlaps(runs, faults=(), died_at=None, log=""):
    abandoned, cancelled = worker_log_marks(log)
    return find_overlaps(list(runs), list(faults), died_at or {}, abandoned, cancelled)


def only(found):
    assert len(found) == 1, found
    return found[0]


def test_runs_one_after_the_other_do_not_overlap():
    assert overlaps([run(1, OLD, 10.0, 11.0, "raise"), run(2, NEW, 11.0, 12.0)]) == []
    # Other jobs never pair up.
    assert overlaps([run(1, OLD, 10.0, 20.0), run(1, NEW, 11.0, 12.0, job_id=OTHER)]) == []


def test_sync_run_frozen_by_sigstop():
    # Paused mid-run past its lease; the job ran elsewhere; resumed, it ended.
    o = only(
        overlaps(
            [run(1, OLD, 10.0, 17.0), run(2, NEW, 15.0, 15.2)],
            [pause(3, OLD, 10.5, 16.9)],
        )
    )
    assert o["verdict"] == "frozen"
    assert (o["fault"], o["fault_kind"]) == (3, "pause")
    assert (o["from"], o["to"]) == (15.0, 15.2)
    assert o["older"]["attempt"] == 1 and o["older"]["pid"] == OLD
    assert o["older"]["mode"] == "sync" and o["newer"]["attempt"] == 2
    assert o["after_resume_ms"] is None  # only measured for async runs


def test_async_run_cancelled_50ms_after_resume_is_frozen():
    o = only(
        overlaps(
            [run(1, OLD, 10.0, 16.95, "cancelled", "awork"), run(2, NEW, 15.0, 20.0, kind="awork")],
            [pause(1, OLD, 10.5, 16.9)],
        )
    )
    assert o["verdict"] == "frozen"
    assert o["older"]["mode"] == "async" and o["older"]["outcome"] == "cancelled"
    assert o["after_resume_ms"] == pytest.approx(50, abs=0.2)
    assert o["to"] == 16.95


def test_async_run_ending_500ms_after_resume_is_a_violation():
    o = only(
        overlaps(
            [run(1, OLD, 10.0, 17.4, "ok", "awork"), run(2, NEW, 15.0, 20.0, kind="awork")],
            [pause(1, OLD, 10.5, 16.9)],
        )
    )
    assert o["verdict"] == "violation"
    assert o["why"] == "async run outlived its resume by 0.500 s"
    assert o["fault"] == 1
    assert o["after_resume_ms"] == pytest.approx(500, abs=0.2)


def test_async_run_that_started_after_resume_must_end_within_the_slack():
    # Claimed, then stopped before the handler's first line; the job ran
    # elsewhere; resumed, the handler started and was cancelled at once.
    runs = [run(1, OLD, 16.92, 16.95, "cancelled", "awork"), run(2, NEW, 15.0, 20.0)]
    assert only(overlaps(runs, [pause(1, OLD, 10.5, 16.9)]))["verdict"] == "frozen"
    runs[0] = run(1, OLD, 16.92, 18.0, "ok", "awork")
    late = only(overlaps(runs, [pause(1, OLD, 10.5, 16.9)]))
    assert late["verdict"] == "violation"
    assert late["why"].startswith("async run outlived its resume by 1.100 s")


def test_abandoned_sync_handler_with_its_log_line():
    runs = [run(1, OLD, 10.0, 30.0), run(2, NEW, 15.0, 16.0)]
    log = log_line(f"abandoned sync handler of job {JOB} attempt 1")
    o = only(overlaps(runs, log=log))
    assert o["verdict"] == "abandoned"
    assert o["worker_logged"] == "abandoned"
    assert o["fault"] is None
    # The line must name this job and this attempt.
    other_attempt = log_line(f"abandoned sync handler of job {JOB} attempt 2")
    assert only(overlaps(runs, log=other_attempt))["verdict"] == "violation"
    other_job = log_line(f"abandoned sync handler of job {OTHER} attempt 1")
    assert only(overlaps(runs, log=other_job))["verdict"] == "violation"


def test_abandoned_does_not_excuse_an_async_run():
    runs = [run(1, OLD, 10.0, 30.0, "ok", "awork"), run(2, NEW, 15.0, 16.0)]
    log = log_line(f"abandoned sync handler of job {JOB} attempt 1")
    assert only(overlaps(runs, log=log))["verdict"] == "violation"


def test_sync_overlap_without_pause_or_log_line_is_unexplained():
    o = only(overlaps([run(1, OLD, 10.0, 30.0), run(2, NEW, 15.0, 16.0)]))
    assert (o["verdict"], o["why"]) == ("violation", "unexplained overlap")
    # A pause of another process explains nothing.
    o = only(overlaps([run(1, OLD, 10.0, 30.0), run(2, NEW, 15.0, 16.0)], [pause(1, NEW, 11, 17)]))
    assert o["verdict"] == "violation"


def test_sync_overlap_that_began_before_the_pause_is_unexplained():
    # Both ran at once before the older process was stopped: not a freeze.
    o = only(
        overlaps([run(1, OLD, 10.0, 30.0), run(2, NEW, 15.0, 25.0)], [pause(2, OLD, 16.0, 22.0)])
    )
    assert o["verdict"] == "violation"
    assert o["fault"] == 2  # named as context


def test_killed_older_run_ends_at_the_kill():
    lives = [
        Life(0, OLD, 0.0, Path("w-0.log"), ended=12.3, end_reason="killed", exit_code=-9),
        Life(1, NEW, 0.0, Path("w-1.log"), ended=40.0, end_reason="stopped", exit_code=0),
    ]
    faults = [kill(4, OLD, 12.0)]
    died_at = process_deaths(lives, faults)
    assert died_at == {OLD: 12.0}  # the kill, not when the runner saw it gone
    # The duplicate started after the kill: no overlap.
    assert overlaps([run(1, OLD, 10.0), run(2, NEW, 16.0, 17.0)], faults, died_at) == []
    # One that started before the kill overlaps until the kill, unexplained.
    o = only(overlaps([run(1, OLD, 10.0), run(2, NEW, 11.0, 17.0)], faults, died_at))
    assert o["older"]["end"] == 12.0 and o["older"]["end_by"] == "process died"
    assert (o["to"], o["fault"], o["verdict"]) == (12.0, 4, "violation")


def test_run_without_end_in_a_live_process_never_ends():
    o = only(overlaps([run(1, OLD, 10.0), run(2, NEW, 100.0, 101.0)]))
    assert o["older"]["end"] is None and o["older"]["end_by"] == "still running"
    assert (o["from"], o["to"]) == (100.0, 101.0)


def test_hung_sync_handler_left_hanging_in_a_resumed_process():
    # hang attempt 1 on OLD, paused past its lease; attempt 2 on NEW, which
    # is killed at 18; attempt 3 on THIRD. Attempt 1 still hangs in OLD.
    runs = [
        run(1, OLD, 1.0, kind="hang"),
        run(2, NEW, 10.0, kind="hang"),
        run(3, THIRD, 20.0, kind="hang"),
    ]
    faults = [pause(1, OLD, 5.0, 12.0), kill(2, NEW, 18.0)]
    found = overlaps(runs, faults, {NEW: 18.0})
    pairs = {(o["older"]["attempt"], o["newer"]["attempt"]): o for o in found}
    assert set(pairs) == {(1, 2), (1, 3)}  # 2 ended at the kill, before 3 started
    assert pairs[(1, 2)]["to"] == 18.0 and pairs[(1, 3)]["to"] is None
    assert all(o["verdict"] == "frozen" and o["fault"] == 1 for o in found)
    # With the worker's line, both are abandoned handlers.
    log = log_line(f"abandoned sync handler of job {JOB} attempt 1")
    found = overlaps(runs, faults, {NEW: 18.0}, log)
    assert [o["verdict"] for o in found] == ["abandoned", "abandoned"]
    # Without any pause the hang overlapping its job's next run is unexplained.
    assert overlaps(runs[:2], [], {})[0]["verdict"] == "violation"


def test_hung_async_handler_must_be_cancelled_at_resume():
    faults = [pause(1, OLD, 5.0, 12.0)]
    cancelled = [run(1, OLD, 1.0, 12.04, "cancelled", "ahang"), run(2, NEW, 10.0, kind="ahang")]
    o = only(overlaps(cancelled, faults))
    assert o["verdict"] == "frozen" and o["after_resume_ms"] == pytest.approx(40, abs=0.2)
    never = [run(1, OLD, 1.0, kind="ahang"), run(2, NEW, 10.0, kind="ahang")]
    o = only(overlaps(never, faults))
    assert o["verdict"] == "violation"
    assert o["why"] == "async run outlived its resume by inf s (it never ended)"
    assert o["after_resume_ms"] is None


def test_worker_log_marks():
    text = (
        log_line(f"abandoned sync handler of job {JOB} attempt 3")
        + log_line(f"cancelled handler of job {OTHER} attempt 12")
        + log_line(f"lost the lease of job {JOB}")
    )
    assert worker_log_marks(text) == ({(JOB, 3)}, {(OTHER, 12)})


def test_records_read_the_cancelled_outcome(tmp_path):
    (tmp_path / "rec-1001.txt").write_text(
        f"S {JOB} 1 1001 10.000000 awork 7\n"
        f"E {JOB} 1 1001 10.500000 cancelled\n"
        f"S {JOB} 2 1001 11.000000 awork 7\n"
        f"E {JOB} 2 1001 11.100000 ok\n"
    )
    runs = read_runs(tmp_path)
    assert [(r.attempt, r.end, r.outcome) for r in runs] == [
        (1, 10.5, "cancelled"),
        (2, 11.1, "ok"),
    ]


def _analyse(
    tmp_path: Path,
    runs: list[Run],
    faults: list[FaultEvent],
    log: str = "",
    rows: dict[str, Row] | None = None,
    recurring: list[Recurring] | None = None,
    plan: Plan | None = None,
    host_stalls: list[HostStall] | None = None,
):
    lives = []
    for slot, pid in enumerate((OLD, NEW)):
        path = tmp_path / f"worker-{slot}.log"
        path.write_text(log if pid == OLD else "")
        lives.append(Life(slot, pid, 0.0, path, ended=50.0, end_reason="stopped", exit_code=0))
    return analyse(
        vendor="sqlite",
        profile="ci",
        seed=1,
        processes=2,
        workers=4,
        plan=plan or Plan(),
        rows=rows or {},
        runs=runs,
        faults=faults,
        lives=lives,
        forced=[],
        times={"start": 0.0, "load_start": 0.0, "load_end": 40.0, "drained": 45.0, "end": 50.0},
        producer={},
        lease=3.0,
        grace=1.0,
        injection_errors=[],
        host_stalls=host_stalls,
        recurring=recurring,
        recurring_grace=60.0,
        schedule_ahead=0.6,
    )


def test_an_unexplained_overlap_fails_the_run(tmp_path):
    result = _analyse(tmp_path, [run(1, OLD, 10.0, 30.0), run(2, NEW, 15.0, 16.0)], [])
    summary = result["overlapping_runs"]
    assert (summary["total"], summary["unexplained"]) == (1, 1)
    assert summary["list"][0]["verdict"] == "violation"
    assert not result["passed"]
    assert any("1 overlapping runs of one job not explained" in v for v in result["violations"])
    assert result["details"]["unexplained_overlaps"] == summary["list"]
    text = render(result, 0.0)
    assert (
        "overlapping runs          1   (frozen by SIGSTOP: 0, abandoned sync handlers: 0, "
        "NOT explained: 1; async runs ended after resume: max - ms)"
    ) in text
    assert f"  {JOB} work sync " in text and "violation: unexplained overlap" in text
    assert text.endswith("RESULT: FAIL")


def test_explained_overlaps_pass(tmp_path):
    runs = [
        run(1, OLD, 10.0, 16.95, "cancelled", "awork"),
        run(2, NEW, 15.0, 20.0, kind="awork"),
        run(1, OLD, 10.0, 30.0, job_id=OTHER),
        run(2, NEW, 21.0, 22.0, job_id=OTHER),
    ]
    log = log_line(f"abandoned sync handler of job {OTHER} attempt 1")
    result = _analyse(tmp_path, runs, [pause(1, OLD, 10.5, 16.9)], log)
    summary = result["overlapping_runs"]
    assert (summary["frozen"], summary["abandoned"], summary["unexplained"]) == (1, 1, 0)
    assert summary["max_async_end_after_resume_ms"] == pytest.approx(50, abs=0.2)
    assert result["log_counts"]["sync handlers abandoned"] == 1
    # Both duplicates are explained by the pause; the run passes.
    assert result["passed"], result["violations"]
    text = render(result, 0.0)
    assert "frozen by SIGSTOP: 1, abandoned sync handlers: 1, NOT explained: 0" in text
    assert "async runs ended after resume: max 50 ms" in text


def test_a_cancelled_run_is_not_a_recorded_failure(tmp_path):
    # The next run after a cancelled one is a duplicate to explain (here: no fault).
    runs = [run(1, OLD, 10.0, 10.5, "cancelled", "awork"), run(2, NEW, 15.0, 16.0, kind="awork")]
    result = _analyse(tmp_path, runs, [])
    assert result["duplicates"]["total"] == 1 and result["duplicates"]["unexplained"] == 1
    assert result["overlapping_runs"]["total"] == 0
    # After a raise it is an ordinary retry.
    runs[0] = run(1, OLD, 10.0, 10.5, "raise", "awork")
    assert _analyse(tmp_path, runs, [])["duplicates"]["total"] == 0


def test_a_run_stopped_at_its_deadline_during_a_database_fault_is_explained(tmp_path):
    # The database took no writes from 11 s to 14 s: the worker stopped the
    # run at its lease deadline, and the job ran again after the fault.
    runs = [
        run(1, OLD, 10.0, 12.8, "cancelled", "awork"),
        run(2, NEW, 16.0, 16.5, kind="awork"),
        run(1, OLD, 17.0, 17.1, job_id=OTHER),  # both processes ran jobs after the fault
    ]
    lock = FaultEvent(1, "sqlite_lock", 11.0, 14.0, None, "BEGIN IMMEDIATE held 3.0s")
    stopped = log_line(
        f"cancelled handler of job {JOB} attempt 1: its lease could not be renewed in time"
    )
    result = _analyse(tmp_path, runs, [lock], stopped)
    dups = result["duplicates"]
    assert (dups["explained_by_deadline_stop"], dups["unexplained"]) == (1, 0)
    assert result["passed"], result["violations"]
    # Without the worker's log line the same runs are not explained.
    result = _analyse(tmp_path, runs, [lock])
    assert result["duplicates"]["unexplained"] == 1 and not result["passed"]
    # Nor is a deadline stop with no database fault around it.
    result = _analyse(tmp_path, runs, [], stopped)
    assert result["duplicates"]["unexplained"] == 1


def test_a_duplicate_after_a_stall_of_the_whole_host_is_explained(tmp_path):
    # The host ran nothing from 7.4 s to 15.9 s: the first run's lease ran out,
    # and the same process ran the job again after the stall.
    runs = [run(1, OLD, 6.0, 16.1), run(2, OLD, 15.95, 17.4)]
    stall = HostStall(7.4, 15.9)
    result = _analyse(tmp_path, runs, [], host_stalls=[stall])
    dups = result["duplicates"]
    assert (dups["total"], dups["explained_by_host_stall"], dups["unexplained"]) == (1, 1, 0)
    text = render(result, 0.0)
    assert "by a stall of the whole host: 1, NOT explained: 0" in text
    assert "(a process that only sleeps woke a second or more late: 8.5s at +7.4s)" in text
    # A stall long before the run explains nothing.
    result = _analyse(tmp_path, runs, [], host_stalls=[HostStall(1.0, 3.0)])
    assert result["duplicates"]["unexplained"] == 1 and not result["passed"]
    assert "by a stall of the whole host: 0, NOT explained: 1" in render(result, 0.0)


def test_the_sentinel_writes_the_stalls_it_sees(tmp_path):
    clock = HostClock(tmp_path / "stalls.txt")
    clock.start()
    assert clock._process is not None
    pid = clock._process.pid
    os.kill(pid, signal.SIGSTOP)  # the host "stops" the sentinel
    time.sleep(1.3)  # the stall itself: nothing to poll for while it lasts
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while not read_stalls(tmp_path / "stalls.txt") and time.monotonic() < deadline:
        time.sleep(0.05)
    stalls = clock.stop()
    assert any(1.2 <= stall.seconds <= 5.0 for stall in stalls), stalls


# -- recurring schedules ------------------------------------------------------------------

T0 = 1_796_112_000_000  # 2026-12-01 08:00:00 UTC, epoch ms (database clock)
EVERY_SECOND = "* * * * * *"


def schedule(cron: str = EVERY_SECOND, removed_at: int = T0 + 9_300) -> Recurring:
    # Registered 0.6 s before T0 (its first occurrence is T0), removed at
    # 9.3 s: the fire times T0 .. T0 + 9 s are owed, 10 of them.
    return Recurring(
        n=0,
        identifier="every-second",
        cron=cron,
        registered=(T0 - 610, T0 - 600),
        removed=(removed_at, removed_at + 10),
    )


def occurrence(fire: int, job_id: str | None = None, claim_after: int = 5) -> Occurrence:
    """An occurrence enqueued 0.4 s ahead, promoted at its fire time, claimed
    ``claim_after`` ms later and run to success."""
    claim = fire + claim_after
    return Occurrence(
        job_id=job_id or f"occ{fire}",
        stage="success",
        fire_ms=fire,
        run_at_ms=fire,
        started_ms=claim,
        history=f"delayed@{fire - 400};enqueued@{fire};running@{claim};success@{claim + 2};",
        ran_ok=True,
        ran=True,
    )


def cancelled(fire: int) -> Occurrence:
    """One enqueued ahead and cancelled by the removal."""
    return Occurrence(
        job_id=f"occ{fire}",
        stage="cancelled",
        fire_ms=fire,
        run_at_ms=fire,
        started_ms=None,
        history=f"delayed@{fire - 500};cancelled@{fire - 300};",
    )


def clean() -> list[Occurrence]:
    return [occurrence(T0 + i * 1000) for i in range(10)] + [cancelled(T0 + 10_000)]


def check(occurrences, sched=None, unattended=None, grace_ms=60_000):
    return check_schedule(
        sched or schedule(),
        occurrences,
        grace_ms=grace_ms,
        ahead_ms=600,
        unattended=unattended,
    )


def problems(checked) -> dict[str, int]:
    return {kind: n for kind, n in checked["counts"].items() if n}


def test_a_clean_schedule_passes():
    c = check(clean())
    assert problems(c) == {}
    assert (c["expected"], c["enqueued"], c["ran"], c["cancelled"]) == (10, 11, 10, 1)
    assert (c["duplicates"], c["missing"], c["max_start_lag_ms"]) == (0, 0, 5)
    # Every other second: 5 fire times in T0 .. T0 + 9.3 s.
    even = [occurrence(T0 + i * 2000) for i in range(5)]
    c = check(even, schedule("*/2 * * * * *"))
    assert problems(c) == {} and c["expected"] == 5


def test_a_fire_time_enqueued_twice_fails():
    c = check([*clean(), occurrence(T0 + 3000, job_id="again")])
    assert problems(c) == {"duplicate": 1}
    assert c["duplicates"] == 1
    dup = c["problems"]["duplicate"][0]
    assert dup["fire_ms"] == T0 + 3000 and dup["fire"] == "08:00:03.000"
    assert sorted(dup["job_ids"]) == ["again", f"occ{T0 + 3000}"]
    # A second occurrence cancelled by the removal is still a second enqueue.
    c = check([*clean(), cancelled(T0 + 10_000)])
    assert problems(c) == {"duplicate": 1}


def test_a_missing_fire_time_fails():
    occurrences = [o for o in clean() if o.fire_ms != T0 + 4000]
    c = check(occurrences)
    assert problems(c) == {"missing": 1}
    assert c["problems"]["missing"] == [{"fire": "08:00:04.000", "fire_ms": T0 + 4000}]
    # The first one too: it is owed from the registration on.
    c = check(clean()[1:])
    assert c["problems"]["missing"] == [{"fire": "08:00:00.000", "fire_ms": T0}]


def test_a_gap_is_allowed_only_where_no_worker_ran_for_longer_than_the_grace():
    occurrences = [o for o in clean() if o.fire_ms not in (T0 + 3000, T0 + 4000)]
    # Nobody ran from T0 + 2.5 s to T0 + 5.2 s; with a grace of 1 s the
    # occurrences missed by more than that (3 s and 4 s, at 5.2 s) collapse.
    down = [(T0 + 2500, T0 + 5200)]
    c = check(occurrences, unattended=down, grace_ms=1000)
    assert problems(c) == {} and (c["missing"], c["missing_allowed"]) == (0, 2)
    # With the default grace of a minute the same stretch excuses nothing.
    assert problems(check(occurrences, unattended=down)) == {"missing": 2}
    # Nor does a stretch elsewhere.
    assert check(occurrences, unattended=[(T0 + 6000, T0 + 9000)], grace_ms=1000)["missing"] == 2


def test_an_off_grid_fire_time_fails():
    c = check([*clean(), occurrence(T0 + 4500)])
    assert problems(c) == {"off_grid": 1}
    assert c["problems"]["off_grid"][0]["fire"] == "08:00:04.500"
    # A minute cron is not on the seconds' grid.
    minutes = schedule("* * * * *", removed_at=T0 + 90_000)
    c = check([occurrence(T0), occurrence(T0 + 60_000)], minutes)
    assert problems(c) == {} and c["expected"] == 2
    c = check([occurrence(T0), occurrence(T0 + 61_000)], minutes)
    assert problems(c) == {"off_grid": 1, "missing": 1}


def test_an_occurrence_claimed_before_its_fire_time_fails():
    occurrences = clean()
    occurrences[5] = occurrence(T0 + 5000, claim_after=-10)
    c = check(occurrences)
    assert problems(c) == {"early": 1}
    early = c["problems"]["early"][0]
    assert (early["fire"], early["first_claim"]) == ("08:00:05.000", "08:00:04.990")
    # The last claim (started_ms) against run_at_ms counts too.
    occurrences[5] = occurrence(T0 + 5000)
    occurrences[5].started_ms = T0 + 4999
    assert problems(check(occurrences)) == {"early": 1}
    # And the handler's own start line (wall clock, a few ms of slack).
    occurrences[5] = occurrence(T0 + 5000)
    occurrences[5].first_start_ms = T0 + 4996
    assert problems(check(occurrences)) == {}
    occurrences[5].first_start_ms = T0 + 4900
    assert problems(check(occurrences)) == {"early": 1}
    assert check(occurrences)["problems"]["early"][0]["handler_start"] == "08:00:04.900"


def test_every_occurrence_due_before_the_removal_runs_and_later_ones_are_cancelled():
    occurrences = clean()
    occurrences[2].ran_ok = False  # success without a recorded handler run
    occurrences[3].stage = "failed"
    occurrences[4] = cancelled(T0 + 4000)  # due, yet cancelled
    occurrences[10] = occurrence(T0 + 10_000)  # due after the removal, yet ran
    c = check(occurrences)
    assert problems(c) == {"not_run": 2, "cancelled_due": 1, "not_cancelled": 1}


def test_a_retried_occurrence_keeps_the_fire_time_seen_before_its_retry():
    history = f"delayed@{T0 - 400};enqueued@{T0};running@{T0 + 5};requeued@{T0 + 4100};"
    row = Row("r1", "tick", "success", 2, b"", None, None, history, "s", T0 + 4200, T0 + 4210)
    assert fire_time(row, {"r1": T0}) == T0
    assert fire_time(row, {}) is None
    row.history = f"delayed@{T0 - 400};enqueued@{T0};running@{T0 + 5};success@{T0 + 7};"
    row.run_at_ms = T0
    assert fire_time(row, {}) == T0
    # One whose fire time nobody saw cannot be checked: a failure.
    occurrences = clean()
    occurrences[0].fire_ms = None
    assert problems(check(occurrences)) == {"unknown_fire_time": 1, "missing": 1}


def test_unattended_spans():
    lives = [
        Life(0, OLD, 10.0, Path("w-0.log"), ended=20.0, end_reason="killed", exit_code=-9),
        Life(0, NEW, 22.0, Path("w-1.log"), ended=50.0, end_reason="stopped", exit_code=0),
    ]
    # A kill, then the replacement paused from 30 s to 40 s.
    assert unattended_spans(lives, [pause(1, NEW, 30.0, 40.0)], 5.0, 50.0) == [
        (5.0, 10.0),
        (20.0, 22.0),
        (30.0, 40.0),
    ]
    other = Life(1, THIRD, 0.0, Path("w-2.log"), ended=50.0, end_reason="stopped", exit_code=0)
    assert unattended_spans([*lives, other], [pause(1, NEW, 30.0, 40.0)], 5.0, 50.0) == []


def _recurring_rows(occurrences: list[Occurrence]) -> tuple[dict[str, Row], list[Run]]:
    rows, runs = {}, []
    for o in occurrences:
        rows[o.job_id] = Row(
            o.job_id,
            "tick",
            o.stage,
            1,
            b"",
            None,
            None,
            o.history,
            "every-second",
            o.run_at_ms,
            o.started_ms,
        )
        if o.ran_ok:
            start = (o.started_ms or 0) / 1000
            runs.append(Run(o.job_id, 1, OLD, start, "tick", 0, start + 0.001, "ok"))
    return rows, runs


def test_the_recurring_check_passes_a_run_and_prints_its_counts(tmp_path):
    rows, runs = _recurring_rows(clean())
    result = _analyse(tmp_path, runs, [], rows=rows, recurring=[schedule()])
    assert result["passed"], result["violations"]
    assert result["jobs"]["unknown_rows"] == 0  # occurrences are not strangers
    text = render(result, 0.0)
    assert "recurring schedules       1" in text
    assert "  every-second         * * * * * *           10       11    10         1" in text
    assert text.splitlines()[-1].startswith("RESULT: PASS")


def test_a_duplicate_occurrence_fails_the_run(tmp_path):
    rows, runs = _recurring_rows([*clean(), occurrence(T0 + 3000, job_id="again")])
    result = _analyse(tmp_path, runs, [], rows=rows, recurring=[schedule()])
    assert not result["passed"]
    assert result["violations"] == [
        "recurring 'every-second': 1 fire times enqueued more than once (08:00:03.000)"
    ]
    checked = result["recurring"]["schedules"][0]
    assert (checked["enqueued"], checked["ran"], checked["duplicates"]) == (12, 11, 1)
    text = render(result, 0.0)
    assert "  recurring every-second duplicate (first 1):" in text
    assert text.endswith("RESULT: FAIL")
    # A missing one is as fatal.
    rows, runs = _recurring_rows([o for o in clean() if o.fire_ms != T0 + 4000])
    result = _analyse(tmp_path, runs, [], rows=rows, recurring=[schedule()])
    assert result["violations"] == [
        "recurring 'every-second': 1 fire times between registration and removal with no "
        "occurrence (08:00:04.000)"
    ]


# -- partition order ---------------------------------------------------------------------
# Runs of partitioned jobs (kind ``ordered``) whose outcome was stored must run
# one at a time per partition, in sequence order; a run cut short by a kill or
# pause, whose outcome was not stored, is a repeat, not order.
TOPIC = "chaos-ordered"


def job_id(i: int) -> str:
    return f"01m8rjk1723gqtq0t5q2pac{i:03d}"


def ordered_row(i: int, sequence: int, attempts: int = 1, partition: int = 3) -> Row:
    return Row(
        job_id(i), "Ordered", "success", attempts, b"", None, None, "", None, 0, None,
        TOPIC, partition, sequence,
    )  # fmt: skip


def orun(
    i: int, attempt: int, pid: int, start: float, end: float | None, outcome: str | None = None
) -> Run:
    """A run of job ``i`` (key ``k01``, place ``i``)."""
    if end is not None and outcome is None:
        outcome = "ok"
    return Run(job_id(i), attempt, pid, start, "ordered", i, end, outcome, "k01", i)


def retry_line(i: int, attempt: int) -> str:
    return log_line(
        f"job {job_id(i)} (tests.chaos.app.jobs.Ordered) attempt {attempt} failed, retrying: "
        "RuntimeError: chaos ordered job fails its first attempt"
    )


def order_of(runs, rows, faults=(), log="", stopped=frozenset()):
    from tests.chaos.report import analyse_order

    return analyse_order(list(runs), rows, [], list(faults), {OLD: log, NEW: ""}, set(stopped))


def clean_partition() -> tuple[list[Run], dict[str, Row], str]:
    """Job 1 fails its first attempt (stored: its retry keeps its place), then
    jobs 1, 2 and 3 succeed, one after the other."""
    rows = {job_id(1): ordered_row(1, 0, attempts=2), **{
        job_id(i): ordered_row(i, i - 1) for i in (2, 3)
    }}  # fmt: skip
    runs = [
        orun(1, 1, OLD, 10.0, 10.1, "raise"),
        orun(1, 2, OLD, 10.3, 10.4),
        orun(2, 1, NEW, 10.5, 10.6),
        orun(3, 1, OLD, 10.7, 10.8),
    ]
    return runs, rows, retry_line(1, 1)


def test_a_clean_partition_passes_and_every_pair_is_counted():
    runs, rows, log = clean_partition()
    order = order_of(runs, rows, log=log)
    assert (order["pairs"], order["violations"], order["stored_runs"]) == (3, 0, 4)
    assert order["not_stored"] == 0 and order["list"] == []
    # A second partition adds its own pairs, never one across partitions.
    rows[job_id(9)] = ordered_row(9, 0, partition=5)
    rows[job_id(10)] = ordered_row(10, 1, partition=5)
    runs += [orun(9, 1, NEW, 10.0, 10.9), orun(10, 1, NEW, 11.0, 11.1)]
    order = order_of(runs, rows, log=log)
    assert (order["pairs"], order["partitions"], order["violations"]) == (4, 2, 0)


def test_a_failure_the_worker_did_not_log_as_stored_is_not_order():
    runs, rows, _ = clean_partition()
    order = order_of(runs, rows, faults=[kill(1, OLD, 10.05)], log="")
    # Its raise is not known to be stored: left out, excused by the kill.
    assert (order["pairs"], order["not_stored"]) == (2, 1)
    assert order["not_stored_by_reason"] == {"kill": 1}


def test_an_overlap_in_a_partition_is_caught():
    runs, rows, log = clean_partition()
    runs[2] = orun(2, 1, NEW, 10.35, 10.6)  # job 2 starts before job 1's retry ended
    order = order_of(runs, rows, log=log)
    assert order["violations"] == 1
    problem = only(order["list"])
    assert problem["why"] == "started before the previous run of its partition ended"
    assert problem["partition"] == f"{TOPIC}/3"
    assert (problem["before"]["job_id"], problem["after"]["job_id"]) == (job_id(1), job_id(2))


def test_an_out_of_order_pair_is_caught():
    runs, rows, log = clean_partition()
    # Job 3 (sequence 2) ran before job 2 (sequence 1).
    runs[2], runs[3] = orun(2, 1, NEW, 10.7, 10.8), orun(3, 1, OLD, 10.5, 10.6)
    order = order_of(runs, rows, log=log)
    assert order["violations"] == 1
    assert only(order["list"])["why"] == "ran after a later job of its partition"


def test_a_job_that_jumps_a_failed_head_is_caught():
    runs, rows, log = clean_partition()
    # Job 2 ran between job 1's stored failure and its retry.
    runs[1], runs[2] = orun(1, 2, OLD, 10.5, 10.6), orun(2, 1, NEW, 10.2, 10.3)
    order = order_of(runs, rows, log=log)
    whys = [p["why"] for p in order["list"]]
    assert whys == [
        "ran while the job before it awaited its retry",
        "ran after a later job of its partition",
    ]


def test_a_killed_run_whose_outcome_was_not_stored_is_excused():
    runs, rows, log = clean_partition()
    # Job 2's first attempt was killed mid-run; its retry on NEW overlaps nothing stored.
    rows[job_id(2)] = ordered_row(2, 1, attempts=2)
    runs[2:3] = [orun(2, 1, OLD, 10.45, None), orun(2, 2, NEW, 10.5, 10.6)]
    order = order_of(runs, rows, faults=[kill(1, OLD, 10.46)], log=log)
    assert (order["violations"], order["pairs"]) == (0, 3)
    assert order["not_stored_by_reason"] == {"kill": 1}
    assert order["not_stored_unexplained"] == []
    # Without the kill nothing explains the lost outcome.
    order = order_of(runs, rows, log=log)
    assert order["not_stored_by_reason"] == {"NOT explained": 1}
    assert only(order["not_stored_unexplained"])["job_id"] == job_id(2)
    # A worker that logged stopping the handler explains it too.
    order = order_of(runs, rows, log=log, stopped={(job_id(2), 1)})
    assert order["not_stored_by_reason"] == {"stopped or discarded by its worker": 1}


def test_a_paused_run_that_ended_after_its_successor_is_excused():
    runs, rows, log = clean_partition()
    # Paused mid-run past its lease: job 2 ran again elsewhere and job 3 after
    # it; the paused run ended last, its success refused by the fence.
    rows[job_id(2)] = ordered_row(2, 1, attempts=2)
    runs[2:3] = [orun(2, 1, OLD, 10.45, 12.0), orun(2, 2, NEW, 10.5, 10.6)]
    order = order_of(runs, rows, faults=[pause(1, OLD, 10.46, 11.9)], log=log)
    assert (order["violations"], order["pairs"]) == (0, 3)
    assert order["not_stored_by_reason"] == {"pause": 1}


def test_the_enqueue_order_of_a_key_must_be_its_sequence_order():
    from tests.chaos.report import enqueue_order_problems

    plan = Plan()
    rows = {}
    for seq, sequence in enumerate([0, 1, 2]):
        job = plan.new("ordered", "success", key="k01", seq=seq)
        plan.bind(job, job_id(seq), "enqueue_to_partition")
        rows[job_id(seq)] = ordered_row(seq, sequence)
    assert enqueue_order_problems(plan.jobs, rows) == []
    rows[job_id(2)] = ordered_row(2, 0)  # the third job got an earlier sequence
    assert only(enqueue_order_problems(plan.jobs, rows))["jobs"] == [job_id(1), job_id(2)]


def test_records_read_the_key_and_place_of_a_partitioned_run(tmp_path):
    (tmp_path / "rec-1001.txt").write_text(
        f"S {job_id(1)} 1 1001 10.000000 aordered 42 k07 3\n"
        f"E {job_id(1)} 1 1001 10.500000 ok\n"
        f"S {job_id(2)} 1 1001 11.000000 work 43\n"
    )
    first, second = read_runs(tmp_path)
    assert (first.kind, first.n, first.key, first.seq, first.end) == (
        "aordered",
        42,
        "k07",
        3,
        10.5,
    )
    assert (second.key, second.seq) == (None, None)


def ordered_plan(rows: dict[str, Row]) -> Plan:
    """A plan that enqueued ``rows``' partitioned jobs, each expected to succeed."""
    plan = Plan()
    for i, row_id in enumerate(sorted(rows)):
        job = plan.new("ordered", "success", key="k01", seq=i)
        plan.bind(job, row_id, "enqueue_to_partition")
    return plan


def test_an_order_violation_fails_the_run_and_prints_its_count(tmp_path):
    runs, rows, log = clean_partition()
    result = _analyse(tmp_path, runs, [], log=log, rows=rows, plan=ordered_plan(rows))
    assert result["passed"], result["violations"]
    text = render(result, 0.0)
    assert "order checks              3   violations 0   (3 partitioned jobs, 4 stored runs" in text
    assert "  runs not stored         0   (none)" in text
    runs[2] = orun(2, 1, NEW, 10.35, 10.6)
    result = _analyse(tmp_path, runs, [], log=log, rows=rows, plan=ordered_plan(rows))
    assert result["violations"] == [
        "1 order violations: runs of one partition that overlap or leave sequence order"
    ]
    text = render(result, 0.0)
    assert "order checks              3   violations 1" in text
    assert "  order_violations (first 1):" in text
    assert text.endswith("RESULT: FAIL")


def test_partitioned_runs_with_no_pair_checked_fail_the_run(tmp_path):
    rows = {job_id(1): ordered_row(1, 0)}
    runs = [orun(1, 1, OLD, 10.0, 10.1)]
    result = _analyse(tmp_path, runs, [], rows=rows, plan=ordered_plan(rows))
    assert result["order"]["pairs"] == 0
    assert result["violations"] == [
        "partitioned jobs ran but no pair of runs was checked for order"
    ]
