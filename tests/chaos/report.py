"""Analysis of a chaos run and its report.

Definitions (docs/project/chaos.md):

- **lost**: a planned job that, after the drain deadline, has no row, or is
  neither in a terminal stage nor legitimately pending (only hung jobs are:
  they stay running, or wait to be re-run after their process was killed);
- **wrong outcome**: a terminal job in another stage than expected, or failed
  for another reason than expected (``parent failed``, the decode error);
- **duplicate run**: a handler run of a job whose previous run did not end in
  a recorded failure (a retry after a raised error is not a duplicate). It is
  *explained* when the previous run's process was killed or paused between
  that run's start and the duplicate's start, when its worker stopped it at
  its lease deadline during a database fault, or when the whole host stalled
  then (``stalls``: a sentinel process woke a second or more late); any
  other duplicate is a violation;
- **overlapping runs**: two runs of one job whose [start, end] intervals
  intersect (``find_overlaps``). Allowed only when the older run's process
  was stopped (SIGSTOP) when the overlap began and, for an async handler, the
  run ended within ``RESUME_SLACK`` of the SIGCONT (*frozen*), or when the
  older run is a sync handler its worker abandoned (*abandoned*, from the
  worker log); any other overlap is a violation;
- **longest wait after a fault**: the largest of, over all faults, the time
  from the fault's end to the first handler start after it, and the longest
  time a job that was ready at the fault's end stayed ready after it;
- **order** (``analyse_order``): per partition, the runs of partitioned
  jobs whose outcome was stored run one at a time in sequence order, a
  failed head retried before anything after it; every other run of them
  (a repeat) is explained by a kill or pause of its process or by its
  worker's own log line;
- **recurring schedules** (``check_schedule``): per schedule, from its
  occurrence rows, every fire time on the cron's grid and enqueued once, none
  missing between registration and removal (unless no worker process ran for
  longer than ``RECURRING_MISSED_GRACE`` around it), every occurrence due
  before the removal run to success and claimed no earlier than its fire
  time, every one due after it cancelled.
"""

from __future__ import annotations

import bisect
import datetime as dt
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from later_django.recurring import cron as cron_mod
from tests.chaos.faults import PROCESS_FAULTS, FaultEvent
from tests.chaos.procs import Life
from tests.chaos.records import Run
from tests.chaos.stalls import HostStall
from tests.chaos.workload import (
    REASON_DECODE,
    REASON_PARENT,
    RUNNING,
    SUCCESS,
    Plan,
    Planned,
    Recurring,
)

TERMINAL = {"success", "failed", "cancelled"}
DB_FAULTS = {"pg_restart", "pg_terminate", "sqlite_lock"}
KILL_KINDS = {"kill", "kill_hung_holder"}
INF = float("inf")
HANG_KINDS = {"hang", "ahang"}
# Handler kinds (app/jobs.py) that are ``async def``: their worker can cancel them.
ASYNC_KINDS = {"awork", "ahang", "aordered"}
MAX_DETAILS = 20
MAX_OVERLAP_ROWS = 30
# An async handler whose lease was lost while its process was stopped must
# end this soon after SIGCONT: its worker cancels it as soon as it wakes.
RESUME_SLACK = 0.1
# How long before an older run's start a pause may have ended and still be
# the reason for the overlap (the process was stopped between the claim and
# the handler's first line, and started the handler after SIGCONT).
LATE_START_WINDOW = 1.0
# The worker log lines of a worker that stopped waiting for a sync handler
# (its thread goes on; its outcome is discarded) or cancelled an async one.
ABANDONED_LINE = re.compile(r"abandoned sync handler of job (\w+) attempt (\d+)")
CANCELLED_LINE = re.compile(r"cancelled handler of job (\w+) attempt (\d+)")
# A handler stopped at its local lease deadline: no renewal could be
# confirmed in time (the database took no writes for most of a lease).
DEADLINE_LINE = re.compile(
    r"(?:abandoned sync handler|cancelled handler) of job (\w+) attempt (\d+): "
    r"its lease could not be renewed in time"
)
# Faults during which no lease can be renewed (a pause counts when the
# paused process held SQLite's write lock).
DATABASE_FAULTS = {"pg_restart", "pg_terminate", "sqlite_lock"}
# The worker log line of a worker that stopped waiting for a handler whose
# lease was lost or could not be confirmed in time (its job is recovered
# elsewhere): the worker is free again.
RELEASE_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*?"
    r"(?:lost the lease of job|abandoned sync handler of job|cancelled handler of job) (\w{26})",
    re.MULTILINE,
)
LOG_PATTERNS = {
    "stuck jobs recovered": "recovered stuck job",
    "outcomes discarded (lease lost)": "after its lease was taken over",
    "hung handlers reported": "its handler may be hung",
    "sync handlers abandoned": "abandoned sync handler of job",
    "async handlers cancelled": "cancelled handler of job",
    "handlers stopped after a lost lease": "its lease was lost",
    "hung workers replaced": "looks hung",
    "claim errors": "could not claim",
    "finish errors": "could not store the outcome",
    "renew errors": " leases: ",
    "heartbeat errors": "heartbeat failed",
    "maintenance step errors": "maintenance step",
    "maintenance restarts": "restarting it",
    "LISTEN reconnects": "LISTEN connection lost",
    "service crashes": "crashed; restarting",
    "partition refresh errors": "could not refresh partition ownership",
    "partition leases lost": "lease lost; stopping its head",
}


@dataclass
class Row:
    id: str
    type_name: str
    stage: str
    attempts: int
    payload: bytes
    last_error: str | None
    parent_id: str | None
    history: str
    # The schedule whose occurrence this is; its fire time (until a retry
    # moves it) and its last claim, on the database's clock.
    recurring: str | None = None
    run_at_ms: int | None = None
    started_ms: int | None = None
    # A partitioned job's topic, partition and place in it (None for plain jobs).
    topic: str | None = None
    partition: int | None = None
    sequence: int | None = None


def _hist(history: str) -> list[tuple[str, float]]:
    out = []
    for entry in history.split(";"):
        if entry:
            stage, _, at = entry.partition("@")
            out.append((stage, int(at) / 1000))
    return out


def _payload_n(payload: bytes) -> int | None:
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        return int(value["n"])
    except Exception:
        return None


def _short(job: Planned, row: Row | None) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "n": job.n,
        "kind": job.kind,
        "api": job.api,
        "expected": job.expected,
        "reason": job.reason,
        "stage": row.stage if row else None,
        "attempts": row.attempts if row else None,
        "last_error": (row.last_error or "").splitlines()[0][:200] if row else None,
        "history": row.history if row else None,
    }


def worker_log_marks(text: str) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """The (job id, attempt) pairs whose handler the worker logs say was
    abandoned (sync: ``abandoned sync handler of job <id> attempt <n>``) and
    cancelled (async: ``cancelled handler of job <id> attempt <n>``)."""
    abandoned = {(m[1], int(m[2])) for m in ABANDONED_LINE.finditer(text)}
    cancelled = {(m[1], int(m[2])) for m in CANCELLED_LINE.finditer(text)}
    return abandoned, cancelled


def process_deaths(lives: list[Life], faults: list[FaultEvent]) -> dict[int, float]:
    """When each worker process that did not live to the end of the run died:
    the start of the fault that killed it, else when it was found gone."""
    killed_at: dict[int, float] = {}
    for fault in faults:
        if fault.kind in KILL_KINDS and fault.pid is not None:
            killed_at.setdefault(fault.pid, fault.start)
    return {
        life.pid: min(killed_at.get(life.pid, life.ended), life.ended)
        for life in lives
        if life.end_reason in ("killed", "exited") and life.ended is not None
    }


def _run_end(run: Run, died_at: dict[int, float]) -> tuple[float, str]:
    """When a run stopped running, and how that is known."""
    if run.end is not None:
        return run.end, "recorded"
    if run.pid in died_at:
        return died_at[run.pid], "process died"
    return INF, "still running"  # a hang, or a process paused at the very end


def _side(run: Run, end: float, end_by: str) -> dict[str, Any]:
    return {
        "attempt": run.attempt,
        "pid": run.pid,
        "start": run.start,
        "end": None if end == INF else end,
        "end_by": end_by,
        "outcome": run.outcome,
        "mode": "async" if run.kind in ASYNC_KINDS else "sync",
    }


def _claim_order(run: Run) -> tuple[int, float]:
    return (run.attempt, run.start)


def _verdict(
    older: Run,
    older_end: float,
    ended_by: str,
    begin: float,
    pauses: list[FaultEvent],
    abandoned: set[tuple[str, int]],
    slack: float,
) -> tuple[str, str, FaultEvent | None, float | None]:
    """The verdict on an overlap that began at ``begin``, why, the pause of the
    older run's process behind it, and how long after that pause's end
    (SIGCONT) an async older run ended."""
    is_async = older.kind in ASYNC_KINDS
    if is_async or older.kind in HANG_KINDS:
        # Stopped during the run (or between its claim and its first line)
        # and still stopped, or stopped before, when the overlap began.
        window = older.start - LATE_START_WINDOW
        candidates = [f for f in pauses if f.start <= begin and f.end >= window]
    else:
        candidates = [f for f in pauses if f.start <= begin < f.end]
    pause = max(candidates, key=lambda f: f.start, default=None)
    lag = older_end - pause.end if pause is not None and is_async else None
    if not is_async and (older.job_id, older.attempt) in abandoned:
        return "abandoned", "its worker abandoned the sync handler", pause, lag
    if pause is None:
        return "violation", "unexplained overlap", None, None
    if lag is None:
        return "frozen", f"pid {older.pid} stopped when the overlap began", pause, lag
    if lag <= slack:
        why = f"pid {older.pid} stopped; ended {lag * 1000:.0f} ms after SIGCONT"
        return "frozen", why, pause, lag
    if lag == INF:
        return "violation", "async run outlived its resume by inf s (it never ended)", pause, lag
    why = f"async run outlived its resume by {lag:.3f} s"
    if ended_by == "process died":
        why += " (until its process died)"
    return "violation", why, pause, lag


def find_overlaps(
    runs: list[Run],
    faults: list[FaultEvent],
    died_at: dict[int, float],
    abandoned: set[tuple[str, int]],
    cancelled: set[tuple[str, int]] | None = None,
    slack: float = RESUME_SLACK,
    host_stalls: list[HostStall] | None = None,
) -> list[dict[str, Any]]:
    """Every pair of runs of one job whose [start, end] intervals intersect,
    with the fault behind it and a verdict.

    A run ends at its ``E`` line; without one, when its process died
    (``died_at``), else never (it still ran when the run ended). The *older*
    run is the one with the lower attempt (claim order). Verdicts:

    - ``abandoned``: the older run is sync and its worker logged that it
      abandoned it (``abandoned`` holds (job id, attempt));
    - ``frozen``: the older run's process was stopped by a ``pause`` fault
      when the overlap began (``pause.start <= begin < pause.end``; for a
      ``hang``, which never ends, a pause during the run before the overlap
      is enough); an async older run must also have ended within ``slack``
      of that pause's end (SIGCONT), else it is a violation. The pause of an
      async run is the last one that began before the overlap and ended no
      earlier than ``LATE_START_WINDOW`` before the run started (a process
      stopped between its claim and its handler's first line). A stall of
      the whole host (``host_stalls``) is a pause of every process;
    - ``violation``: anything else.
    """
    stalls = [
        FaultEvent(0, "host_stall", stall.start, stall.end, None, "host stall")
        for stall in host_stalls or []
    ]
    pauses: dict[int, list[FaultEvent]] = defaultdict(lambda: list(stalls))
    process_faults: dict[int, list[FaultEvent]] = defaultdict(list)
    for fault in faults:
        if fault.pid is None:
            continue
        if fault.kind == "pause":
            pauses[fault.pid].append(fault)
        if fault.kind in PROCESS_FAULTS:
            process_faults[fault.pid].append(fault)
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    out: list[dict[str, Any]] = []
    for job_id, job_runs in by_job.items():
        if len(job_runs) < 2:
            continue
        spans = [(r, *_run_end(r, died_at)) for r in sorted(job_runs, key=_claim_order)]
        for i, (older, o_end, o_by) in enumerate(spans):
            for newer, n_end, n_by in spans[i + 1 :]:
                begin, until = max(older.start, newer.start), min(o_end, n_end)
                if begin >= until:
                    continue
                verdict, why, pause, lag = _verdict(
                    older, o_end, o_by, begin, pauses[older.pid], abandoned, slack
                )
                # The fault behind it: that pause, else the last kill/pause of
                # the older run's process during it (context for a violation).
                nearby = [
                    f
                    for f in process_faults.get(older.pid, [])
                    if f.start <= until and f.end >= older.start - LATE_START_WINDOW
                ]
                behind = pause or max(nearby, key=lambda f: f.start, default=None)
                key = (older.job_id, older.attempt)
                logged = None
                if key in abandoned:
                    logged = "abandoned"
                elif cancelled is not None and key in cancelled:
                    logged = "cancelled"
                out.append(
                    {
                        "job_id": job_id,
                        "kind": older.kind,
                        "n": older.n,
                        "older": _side(older, o_end, o_by),
                        "newer": _side(newer, n_end, n_by),
                        "from": begin,
                        "to": None if until == INF else until,
                        "fault": behind.index if behind else None,
                        "fault_kind": behind.kind if behind else None,
                        "verdict": verdict,
                        "why": why,
                        "after_resume_ms": (
                            round(lag * 1000, 1) if lag is not None and lag != INF else None
                        ),
                        "worker_logged": logged,
                    }
                )
    return sorted(out, key=lambda o: (o["from"], o["job_id"]))


def summarise_overlaps(overlaps: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = Counter(o["verdict"] for o in overlaps)
    lags = [o["after_resume_ms"] for o in overlaps if o["after_resume_ms"] is not None]
    return {
        "total": len(overlaps),
        "frozen": verdicts["frozen"],
        "abandoned": verdicts["abandoned"],
        "unexplained": verdicts["violation"],
        "async_outlived_resume": sum(
            1 for o in overlaps if o["why"].startswith("async run outlived")
        ),
        "max_async_end_after_resume_ms": max(lags, default=None),
        "resume_slack_seconds": RESUME_SLACK,
        "list": overlaps,
    }


# -- recurring schedules ---------------------------------------------------------------
# What each check of a schedule's occurrences found, by the key the report uses.
RECURRING_PROBLEMS = {
    "duplicate": "fire times enqueued more than once",
    "missing": "fire times between registration and removal with no occurrence",
    "off_grid": "occurrences whose fire time is not on the cron's grid",
    "before_registration": "occurrences due before the schedule was registered",
    "early": "occurrences claimed or started before their fire time",
    "not_run": "occurrences due before the removal that did not run to success",
    "cancelled_due": "occurrences due before the removal that the removal cancelled",
    "not_cancelled": "occurrences due after the removal that were not cancelled",
    "cancelled_ran": "cancelled occurrences whose handler ran",
    "unknown_fire_time": "occurrences retried before the runner saw their fire time",
}
MAX_FIRE_TIMES = 10
# A handler's recorded start (time.time() in the worker) may read a hair
# before the database's millisecond clock that stamped its claim.
HANDLER_CLOCK_SLACK_MS = 5


@dataclass
class Occurrence:
    """One occurrence row of a schedule."""

    job_id: str
    stage: str
    # Its fire time: ``run_at_ms`` until a retry moved that to the retry's
    # time; then what the runner saw before (None: it saw nothing).
    fire_ms: int | None
    run_at_ms: int
    started_ms: int | None
    history: str
    # Its handler recorded a run that ended ``ok``.
    ran_ok: bool = False
    # Its handler recorded any run.
    ran: bool = False
    # The first handler start it recorded (wall clock, epoch ms; the same
    # host's clock as the database's).
    first_start_ms: int | None = None


def fire_time(row: Row, seen: dict[str, int]) -> int | None:
    """The fire time of an occurrence row: its ``run_at_ms``, unless a retry
    moved it (``requeued`` in its history); then the value the runner's
    watcher saw before the retry, if it saw one."""
    if "requeued@" not in row.history:
        return row.run_at_ms
    return seen.get(row.id)


def _first_claim_ms(history: str) -> int | None:
    """The first ``running@`` stamp of a stage history: the first claim."""
    for entry in history.split(";"):
        stage, _, at = entry.partition("@")
        if stage == "running":
            return int(at)
    return None


def _at(ms: int) -> str:
    """A database-clock time, to the millisecond, UTC."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def unattended_spans(
    lives: list[Life], faults: list[FaultEvent], start: float, end: float
) -> list[tuple[float, float]]:
    """The spans of [start, end] (wall clock, s) during which no worker process
    ran: none was alive, or every live one was stopped by a pause."""
    running: list[tuple[float, float]] = []
    pauses: dict[int, list[FaultEvent]] = defaultdict(list)
    for fault in faults:
        if fault.kind == "pause" and fault.pid is not None:
            pauses[fault.pid].append(fault)
    for life in lives:
        at, until = life.started, life.ended if life.ended is not None else end
        for pause in sorted(pauses.get(life.pid, []), key=lambda f: f.start):
            if pause.start > at:
                running.append((at, min(pause.start, until)))
            at = max(at, pause.end)
        if until > at:
            running.append((at, until))
    spans: list[tuple[float, float]] = []
    covered = start
    for at, until in sorted(running):
        if at > covered:
            spans.append((covered, min(at, end)))
        covered = max(covered, until)
        if covered >= end:
            break
    if covered < end:
        spans.append((covered, end))
    return [(a, b) for a, b in spans if b > a]


def check_schedule(
    schedule: Recurring,
    occurrences: list[Occurrence],
    *,
    grace_ms: int,
    ahead_ms: int,
    unattended: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Check one schedule's occurrences against its cron; return its counts
    and, under ``problems``, the fire times (or jobs) behind each violation.

    Times are the database's epoch ms. The schedule was registered within
    ``schedule.registered`` and removed within ``schedule.removed`` (before,
    after). Required: every grid point from the first after registration to
    the removal has exactly one occurrence, except a fire time in a span of
    ``unattended`` (no worker process ran) longer than ``grace_ms``: those
    missed by more than the grace collapse into one (from ``ahead_ms`` before
    the span, when the last scheduler tick could have enqueued it, to the
    grace before its end). Every occurrence due before the removal runs to
    success (its handler recorded ``ok``); one due after it is cancelled; an
    occurrence is never claimed (its first ``running@``, and its last claim
    ``started_ms`` against its ``run_at_ms``) nor its handler started (its
    first record, within ``HANDLER_CLOCK_SLACK_MS``) before its fire time.
    """
    cron = cron_mod.parse(schedule.cron)
    problems: dict[str, list[Any]] = {kind: [] for kind in RECURRING_PROBLEMS}
    by_fire: dict[int, list[Occurrence]] = defaultdict(list)
    registered_before, registered_after = schedule.registered
    removed_before, removed_after = schedule.removed or (None, None)
    lags: list[int] = []
    for occ in sorted(occurrences, key=lambda o: (o.fire_ms or 0, o.job_id)):
        info = {"job_id": occ.job_id, "stage": occ.stage, "history": occ.history}
        first_claim = _first_claim_ms(occ.history)
        if occ.fire_ms is None:
            problems["unknown_fire_time"].append(info)
        else:
            info["fire"] = _at(occ.fire_ms)
            by_fire[occ.fire_ms].append(occ)
            if cron.next_after(occ.fire_ms - 1) != occ.fire_ms:
                problems["off_grid"].append(info)
            elif occ.fire_ms <= registered_before:
                problems["before_registration"].append(info)
            if first_claim is not None:
                lags.append(first_claim - occ.fire_ms)
        fire = occ.fire_ms
        if (
            (fire is not None and first_claim is not None and first_claim < fire)
            or (occ.started_ms is not None and occ.started_ms < occ.run_at_ms)
            or (
                fire is not None
                and occ.first_start_ms is not None
                and occ.first_start_ms < fire - HANDLER_CLOCK_SLACK_MS
            )
        ):
            problems["early"].append(
                {
                    **info,
                    "first_claim": None if first_claim is None else _at(first_claim),
                    "started": None if occ.started_ms is None else _at(occ.started_ms),
                    "run_at": _at(occ.run_at_ms),
                    "handler_start": (
                        None if occ.first_start_ms is None else _at(occ.first_start_ms)
                    ),
                }
            )
        due = occ.fire_ms is None or removed_before is None or occ.fire_ms <= removed_before
        after = (
            removed_after is not None and occ.fire_ms is not None and occ.fire_ms > removed_after
        )
        if occ.stage == "cancelled":
            if occ.ran:
                problems["cancelled_ran"].append(info)
            elif due:
                problems["cancelled_due"].append(info)
        elif after:
            problems["not_cancelled"].append(info)
        elif occ.stage != SUCCESS or not occ.ran_ok:
            problems["not_run"].append({**info, "handler_ok": occ.ran_ok})
    for fire, occs in sorted(by_fire.items()):
        if len(occs) > 1:
            problems["duplicate"].append(
                {"fire": _at(fire), "fire_ms": fire, "job_ids": [o.job_id for o in occs]}
            )
    required: list[int] = []
    if removed_before is not None:
        at = cron.next_after(registered_after)
        while at <= removed_before:
            required.append(at)
            at = cron.next_after(at)
    allowed: list[int] = []
    for fire in required:
        if fire in by_fire:
            continue
        if any(
            b - a > grace_ms and a - ahead_ms <= fire < b - grace_ms for a, b in unattended or []
        ):
            allowed.append(fire)
        else:
            problems["missing"].append({"fire": _at(fire), "fire_ms": fire})
    return {
        "identifier": schedule.identifier,
        "cron": schedule.cron,
        "registered_ms": list(schedule.registered),
        "removed_ms": None if schedule.removed is None else list(schedule.removed),
        "expected": len(required),
        "enqueued": len(occurrences),
        "fire_times": len(by_fire),
        "ran": sum(1 for o in occurrences if o.ran_ok),
        "cancelled": sum(1 for o in occurrences if o.stage == "cancelled"),
        "retried": sum(1 for o in occurrences if "requeued@" in o.history),
        "duplicates": sum(len(d["job_ids"]) - 1 for d in problems["duplicate"]),
        "missing": len(problems["missing"]),
        "missing_allowed": len(allowed),
        "max_start_lag_ms": max(lags, default=None),
        "counts": {kind: len(items) for kind, items in problems.items()},
        "problems": problems,
        "removed": schedule.removed is not None,
    }


def recurring_violations(checked: dict[str, Any]) -> list[str]:
    """The violations of one checked schedule (``check_schedule``), one a kind."""
    name = checked["identifier"]
    out = []
    if not checked["removed"]:
        out.append(f"recurring {name!r}: was never removed")
    for kind, items in checked["problems"].items():
        if not items:
            continue
        shown = [item.get("fire") or item["job_id"] for item in items[:MAX_FIRE_TIMES]]
        more = f", ... {len(items) - len(shown)} more" if len(items) > len(shown) else ""
        out.append(
            f"recurring {name!r}: {len(items)} {RECURRING_PROBLEMS[kind]} "
            f"({', '.join(shown)}{more})"
        )
    return out


def analyse_recurring(
    schedules: list[Recurring],
    rows: dict[str, Row],
    runs_by_job: dict[str, list[Run]],
    seen: dict[str, int],
    *,
    grace_ms: int,
    ahead_ms: int,
    unattended: list[tuple[int, int]],
) -> list[dict[str, Any]]:
    """``check_schedule`` for every schedule of the run, over its rows."""
    by_schedule: dict[str, list[Occurrence]] = defaultdict(list)
    for row in rows.values():
        if row.recurring is None or row.run_at_ms is None:
            continue
        runs = runs_by_job.get(row.id, [])
        by_schedule[row.recurring].append(
            Occurrence(
                job_id=row.id,
                stage=row.stage,
                fire_ms=fire_time(row, seen),
                run_at_ms=row.run_at_ms,
                started_ms=row.started_ms,
                history=row.history,
                ran_ok=any(r.outcome == "ok" for r in runs),
                ran=bool(runs),
                first_start_ms=min((round(r.start * 1000) for r in runs), default=None),
            )
        )
    return [
        check_schedule(
            schedule,
            by_schedule.get(schedule.identifier, []),
            grace_ms=grace_ms,
            ahead_ms=ahead_ms,
            unattended=unattended,
        )
        for schedule in schedules
    ]


# -- partition order -------------------------------------------------------------------
# Handler kinds of partitioned jobs (app/jobs.py ``Ordered``, ``AsyncOrdered``).
ORDERED_KINDS = {"ordered", "aordered"}
# The worker log lines of a failure that was stored: a retry, or the last failure.
STORED_FAILURE_LINE = re.compile(
    r"job (\w{26}) \([^)]*\) (?:attempt (\d+) failed, retrying|failed on attempt (\d+))"
)
# The worker log line of an outcome its worker did not store (the lease was gone).
DISCARDED_LINE = re.compile(r"job (\w{26}) \([^)]*\) finished after its lease was taken over")

Lane = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class OrderedRun:
    """A run of a partitioned job whose outcome was stored, placed in its
    partition by its row's sequence."""

    run: Run
    lane: Lane
    sequence: int


def stored_failures(text: str) -> set[tuple[str, int]]:
    """The (job id, attempt) pairs whose failure the worker logs say was stored."""
    return {(m[1], int(m[2] or m[3])) for m in STORED_FAILURE_LINE.finditer(text)}


def discarded_outcomes(logs: dict[int, str]) -> set[tuple[int, str]]:
    """The (pid, job id) pairs of outcomes a worker process did not store."""
    return {(pid, m[1]) for pid, text in logs.items() for m in DISCARDED_LINE.finditer(text)}


def _outcome_stored(run: Run, row: Row, failures: set[tuple[str, int]]) -> bool:
    """A failure counts when its worker stored it (its retry keeps the job's
    place); a success only for the attempt the row succeeded with (the fence
    refuses any other)."""
    if run.end is None:
        return False
    if run.outcome == "raise":
        return (run.job_id, run.attempt) in failures
    return run.outcome == "ok" and row.stage == SUCCESS and row.attempts == run.attempt


def split_ordered_runs(
    runs: list[Run], rows: dict[str, Row], failures: set[tuple[str, int]]
) -> tuple[dict[Lane, list[OrderedRun]], list[Run]]:
    """The runs of partitioned jobs whose outcome was stored, per partition in
    start order, and the others (runs cut short by a fault, or whose outcome
    was discarded: repeats, not order). A run of a job with no row is left
    out: that job is lost, and reported as such."""
    lanes: dict[Lane, list[OrderedRun]] = defaultdict(list)
    not_stored: list[Run] = []
    for run in runs:
        row = rows.get(run.job_id)
        if run.kind not in ORDERED_KINDS or row is None or row.sequence is None:
            continue
        if _outcome_stored(run, row, failures):
            lane = (str(row.topic), int(row.partition or 0))
            lanes[lane].append(OrderedRun(run, lane, row.sequence))
        else:
            not_stored.append(run)
    for lane_runs in lanes.values():
        lane_runs.sort(key=lambda o: o.run.start)
    return lanes, not_stored


def _order_problem(before: OrderedRun, after: OrderedRun) -> str | None:
    """What is wrong with ``after`` running next after ``before`` in one
    partition, or None."""
    assert before.run.end is not None  # a stored run ended
    if after.run.start < before.run.end:
        return "started before the previous run of its partition ended"
    if after.sequence < before.sequence:
        return "ran after a later job of its partition"
    if before.run.outcome == "raise" and after.run.job_id != before.run.job_id:
        return "ran while the job before it awaited its retry"
    if after.sequence == before.sequence and before.run.outcome != "raise":
        return "ran again after its success was stored"
    return None


def check_partition_order(lanes: dict[Lane, list[OrderedRun]]) -> tuple[int, list[dict[str, Any]]]:
    """Compare each stored run with the stored run before it in its partition:
    one at a time (no overlap), in sequence order, a failed head retried
    before anything after it. Return the number of pairs compared and the
    violations. A partition holds many keys, so each key's order is checked
    too."""
    pairs, problems = 0, []
    for lane, lane_runs in sorted(lanes.items()):
        for before, after in zip(lane_runs, lane_runs[1:], strict=False):
            pairs += 1
            why = _order_problem(before, after)
            if why is not None:
                problems.append(
                    {
                        "partition": f"{lane[0]}/{lane[1]}",
                        "why": why,
                        "before": _ordered_side(before),
                        "after": _ordered_side(after),
                    }
                )
    return pairs, problems


def _ordered_side(o: OrderedRun) -> dict[str, Any]:
    run = o.run
    return {
        "job_id": run.job_id,
        "key": f"{run.key}:{run.seq}",
        "sequence": o.sequence,
        "attempt": run.attempt,
        "pid": run.pid,
        "start": run.start,
        "end": run.end,
        "outcome": run.outcome,
    }


def not_stored_reason(
    run: Run,
    until: float,
    faults_of_pid: list[FaultEvent],
    stopped: set[tuple[str, int]],
    discarded: set[tuple[int, str]],
) -> str | None:
    """Why a run's outcome was not stored: a kill or pause of its process
    between its start (or its claim, just before) and ``until`` (the start of
    its job's next attempt), or its worker saying it stopped the handler or
    discarded the outcome after losing the lease; None when nothing explains
    it."""
    fault = max(
        (f for f in faults_of_pid if run.start - LATE_START_WINDOW <= f.end and f.start <= until),
        key=lambda f: f.start,
        default=None,
    )
    if fault is not None:
        return fault.kind
    if (run.job_id, run.attempt) in stopped or (run.pid, run.job_id) in discarded:
        return "stopped or discarded by its worker"
    return None


def enqueue_order_problems(planned: list[Planned], rows: dict[str, Row]) -> list[dict[str, Any]]:
    """Planned partitioned jobs of one key whose partition sequences do not
    follow their enqueue order (one producer thread enqueues them, so commit
    order is enqueue order), or that landed in different partitions."""
    by_key: dict[str, list[tuple[int, Planned, Row]]] = defaultdict(list)
    for job in planned:
        row = rows.get(str(job.job_id))
        if job.kind in ORDERED_KINDS and row is not None and row.sequence is not None:
            by_key[str(job.key)].append((int(job.seq or 0), job, row))
    problems = []
    for key, jobs in sorted(by_key.items()):
        jobs.sort(key=lambda item: item[0])
        for (_, a, ra), (seq, b, rb) in zip(jobs, jobs[1:], strict=False):
            if (ra.topic, ra.partition) != (rb.topic, rb.partition) or (
                (rb.sequence or 0) <= (ra.sequence or 0)
            ):
                problems.append(
                    {
                        "key": key,
                        "seq": seq,
                        "jobs": [a.job_id, b.job_id],
                        "partitions": [ra.partition, rb.partition],
                        "sequences": [ra.sequence, rb.sequence],
                    }
                )
    return problems


def analyse_order(
    runs: list[Run],
    rows: dict[str, Row],
    planned: list[Planned],
    faults: list[FaultEvent],
    logs: dict[int, str],
    stopped: set[tuple[str, int]],
) -> dict[str, Any]:
    """The order section of the report: partition order over the stored runs
    of partitioned jobs, and why each other run of them was not stored."""
    all_logs = "\n".join(logs.values())
    lanes, not_stored = split_ordered_runs(runs, rows, stored_failures(all_logs))
    pairs, problems = check_partition_order(lanes)
    faults_by_pid: dict[int, list[FaultEvent]] = defaultdict(list)
    for fault in faults:
        if fault.kind in PROCESS_FAULTS and fault.pid is not None:
            faults_by_pid[fault.pid].append(fault)
    next_start: dict[tuple[str, int], float] = {}
    for run in runs:
        if run.kind in ORDERED_KINDS:
            for attempt in range(1, run.attempt):
                key = (run.job_id, attempt)
                next_start[key] = min(next_start.get(key, INF), run.start)
    discarded = discarded_outcomes(logs)
    reasons: Counter[str] = Counter()
    unexplained = []
    for run in not_stored:
        until = next_start.get((run.job_id, run.attempt), INF)
        why = not_stored_reason(run, until, faults_by_pid.get(run.pid, []), stopped, discarded)
        reasons[why or "NOT explained"] += 1
        if why is None:
            unexplained.append(
                {"job_id": run.job_id, "attempt": run.attempt, "pid": run.pid, "start": run.start}
            )
    jobs = [job for job in planned if job.kind in ORDERED_KINDS]
    return {
        "partitioned_jobs": len(jobs),
        "runs": sum(1 for run in runs if run.kind in ORDERED_KINDS),
        "stored_runs": sum(len(lane_runs) for lane_runs in lanes.values()),
        "partitions": len(lanes),
        "pairs": pairs,
        "violations": len(problems),
        "not_stored": len(not_stored),
        "not_stored_by_reason": dict(reasons),
        "not_stored_unexplained": unexplained,
        "enqueue_order_problems": enqueue_order_problems(planned, rows),
        "list": problems,
    }


def order_verdicts(order: dict[str, Any]) -> list[str]:
    """The violations of the order section: any order violation, any run
    whose outcome was lost for no reason, and a run with partitioned work
    that checked nothing."""
    out = []
    if order["violations"]:
        out.append(
            f"{order['violations']} order violations: runs of one partition that overlap or "
            "leave sequence order"
        )
    if (order["partitioned_jobs"] or order["runs"]) and not order["pairs"]:
        out.append("partitioned jobs ran but no pair of runs was checked for order")
    if order["not_stored_unexplained"]:
        out.append(
            f"{len(order['not_stored_unexplained'])} runs of partitioned jobs whose outcome was "
            "not stored, with no kill or pause of their process nor a worker's stop to explain it"
        )
    if order["enqueue_order_problems"]:
        out.append(
            f"{len(order['enqueue_order_problems'])} partitioned jobs whose partition sequence "
            "does not follow their enqueue order"
        )
    return out


def analyse(
    *,
    vendor: str,
    profile: str,
    seed: int,
    processes: int,
    workers: int,
    plan: Plan,
    processes_each: int = 1,
    rows: dict[str, Row],
    runs: list[Run],
    faults: list[FaultEvent],
    lives: list[Life],
    forced: list[Life],
    times: dict[str, float],
    producer: dict[str, Any],
    lease: float,
    grace: float,
    injection_errors: list[str],
    host_stalls: list[HostStall] | None = None,
    recurring: list[Recurring] | None = None,
    fire_seen: dict[str, int] | None = None,
    recurring_grace: float = 60.0,
    schedule_ahead: float = 0.6,
) -> dict[str, Any]:
    end_time = times["end"]
    violations: list[str] = []
    planned = [job for job in plan.jobs if job.job_id]
    runs_by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        runs_by_job[run.job_id].append(run)

    # -- outcomes -----------------------------------------------------------------------
    stages: Counter[str] = Counter()
    expected: Counter[str] = Counter()
    lost: list[dict[str, Any]] = []
    wrong: list[dict[str, Any]] = []
    success_without_run: list[dict[str, Any]] = []
    unexpected_runs: list[dict[str, Any]] = []
    failed_by_reason: Counter[str] = Counter()
    hung_pending = 0
    for job in planned:
        assert job.job_id is not None
        row = rows.get(job.job_id)
        expected[job.expected] += 1
        if row is None:
            lost.append({**_short(job, None), "why": "no row"})
            continue
        stages[row.stage] += 1
        if job.expected == RUNNING:
            if row.stage in TERMINAL:
                wrong.append({**_short(job, row), "why": "a hung job finished"})
            else:
                hung_pending += 1
            continue
        if row.stage not in TERMINAL:
            lost.append({**_short(job, row), "why": f"still {row.stage} after the drain"})
            continue
        if row.stage != job.expected:
            wrong.append({**_short(job, row), "why": f"{row.stage}, expected {job.expected}"})
            continue
        if row.stage == "failed":
            failed_by_reason[job.reason or "?"] += 1
        if job.reason in (REASON_PARENT, REASON_DECODE) and job.reason not in (
            row.last_error or ""
        ):
            wrong.append({**_short(job, row), "why": f"failed, but not with {job.reason!r}"})
        if row.stage == SUCCESS and not any(
            r.outcome == "ok" for r in runs_by_job.get(job.job_id, [])
        ):
            success_without_run.append(_short(job, row))
        if job.reason in (REASON_PARENT, REASON_DECODE) and runs_by_job.get(job.job_id):
            unexpected_runs.append({**_short(job, row), "why": "its handler ran"})

    # Rows the plan does not know: a retried enqueue whose first commit had
    # gone through (same ``n``), or something that should not exist.
    extra_rows: list[dict[str, Any]] = []
    unknown_rows: list[dict[str, Any]] = []
    by_n = {job.n: job for job in planned}
    identifiers = {schedule.identifier for schedule in recurring or []}
    for row in rows.values():
        if row.id in plan.by_id or row.recurring in identifiers:
            continue
        n = _payload_n(row.payload)
        info = {"job_id": row.id, "n": n, "type": row.type_name, "stage": row.stage}
        if n is not None and n in by_n:
            extra_rows.append(info)
        else:
            unknown_rows.append(info)

    # -- duplicate runs ---------------------------------------------------------------
    logs = {
        life.pid: (life.log.read_text(errors="replace") if life.log.exists() else "")
        for life in lives
    }
    all_logs = "\n".join(logs.values())
    deadline_stops = {(m[1], int(m[2])) for m in DEADLINE_LINE.finditer(all_logs)}
    database_faults = [
        f for f in faults if f.kind in DATABASE_FAULTS or getattr(f, "db_frozen", False)
    ]
    process_faults = [f for f in faults if f.kind in PROCESS_FAULTS and f.pid is not None]
    faults_by_pid: dict[int, list[FaultEvent]] = defaultdict(list)
    for fault in process_faults:
        faults_by_pid[fault.pid].append(fault)  # type: ignore[index]
    duplicates: list[dict[str, Any]] = []
    same_attempt: list[dict[str, Any]] = []
    dup_by_fault: Counter[int] = Counter()
    recovery_by_kind: dict[str, float] = {}
    for job_id, job_runs in runs_by_job.items():
        attempts = Counter(run.attempt for run in job_runs)
        twice = [a for a, k in attempts.items() if k > 1]
        if twice:
            same_attempt.append({"job_id": job_id, "attempts": twice})
        # In claim order (the attempt is the lease's epoch), not start order: a
        # process paused between its claim and its handler's first line starts
        # the handler after the job was already recovered and run elsewhere.
        by_attempt = sorted(job_runs, key=lambda r: (r.attempt, r.start))
        row = rows.get(job_id)
        hist = _hist(row.history) if row else []
        claims = [i for i, (stage, _) in enumerate(hist) if stage == "running"]
        for prev, cur in zip(by_attempt, by_attempt[1:], strict=False):
            if prev.outcome == "raise":
                continue
            if 0 < prev.attempt <= len(claims):
                at = claims[prev.attempt - 1]
                claimed = hist[at][1]
                # When the attempt was taken from it: the recovery's requeue.
                taken = next((t for st, t in hist[at + 1 :] if st != "running"), cur.start)
            else:
                claimed, taken = prev.start, cur.start
            # The fault of its process that made the job recoverable: during the
            # attempt, and recent enough to be why the lease expired then.
            explained = max(
                (
                    f
                    for f in faults_by_pid.get(prev.pid, [])
                    if min(claimed, prev.start) - 0.05 <= f.start <= max(taken, cur.start)
                    and taken <= f.end + lease + grace + 10
                ),
                key=lambda f: f.start,
                default=None,
            )
            stopped_by = None
            if explained is None and (job_id, prev.attempt) in deadline_stops:
                # Stopped by its worker at its lease deadline: a database
                # fault during the run kept every renewal from landing.
                stopped_by = max(
                    (
                        f
                        for f in database_faults
                        if f.start <= max(taken, cur.start) and f.end >= prev.start - lease
                    ),
                    key=lambda f: f.start,
                    default=None,
                )
                explained = stopped_by
            # Every process stopped at once: the host did not run them, so
            # no lease could be renewed (a pause of every process).
            stall = (
                None
                if explained is not None
                else max(
                    (
                        s
                        for s in host_stalls or []
                        if min(claimed, prev.start) - 0.05 <= s.end
                        and s.start <= max(taken, cur.start)
                        and taken <= s.end + lease + grace + 10
                    ),
                    key=lambda s: s.seconds,
                    default=None,
                )
            )
            entry = {
                "job_id": job_id,
                "kind": cur.kind,
                "n": cur.n,
                "first": {
                    "attempt": prev.attempt,
                    "pid": prev.pid,
                    "start": prev.start,
                    "end": prev.end,
                    "outcome": prev.outcome,
                },
                "again": {"attempt": cur.attempt, "pid": cur.pid, "start": cur.start},
                "fault": explained.index if explained else None,
                "fault_kind": explained.kind if explained else None,
                "deadline_stop": stopped_by is not None,
                "host_stall": None if stall is None else round(stall.seconds, 2),
            }
            duplicates.append(entry)
            if explained:
                dup_by_fault[explained.index] += 1
                wait = cur.start - explained.start
                recovery_by_kind[explained.kind] = max(
                    recovery_by_kind.get(explained.kind, 0.0), wait
                )
    unexplained = [d for d in duplicates if d["fault"] is None and d["host_stall"] is None]
    frozen = [f for f in faults if getattr(f, "db_frozen", False)]
    for dup in unexplained:
        # Still a violation, with a diagnosis: a pause of the process
        # holding SQLite's write lock stops every lease renewal in every process.
        during = next(
            (
                f.index
                for f in frozen
                if f.start <= dup["again"]["start"] and f.end >= dup["first"]["start"] - lease
            ),
            None,
        )
        dup["during_sqlite_freeze_by_pause"] = during

    # -- waits after faults -------------------------------------------------------------
    starts = sorted(run.start for run in runs)
    intervals: list[tuple[float, float]] = []
    for row in rows.values():
        hist = _hist(row.history)
        for i, (stage, at) in enumerate(hist):
            if stage == "enqueued":
                until = hist[i + 1][1] if i + 1 < len(hist) else end_time
                intervals.append((at, until))
    intervals.sort()
    interval_starts = [a for a, _ in intervals]
    prefix_max_end: list[float] = []
    best = float("-inf")
    for _, until in intervals:
        best = max(best, until)
        prefix_max_end.append(best)
    fault_rows = []
    longest: tuple[float, int | None] = (0.0, None)
    for fault in faults:
        i = bisect.bisect_right(starts, fault.end)
        first_start = starts[i] - fault.end if i < len(starts) else None
        j = bisect.bisect_right(interval_starts, fault.end)
        ready_wait = max(0.0, prefix_max_end[j - 1] - fault.end) if j else 0.0
        wait = max(first_start or 0.0, ready_wait)
        if wait > longest[0]:
            longest = (wait, fault.index)
        fault_rows.append(
            {
                **fault.as_dict(),
                "duplicates": dup_by_fault.get(fault.index, 0),
                "first_start_after": first_start,
                "max_ready_wait_after": ready_wait,
            }
        )

    # -- worker processes -----------------------------------------------------------------
    exited = [life for life in lives if life.end_reason == "exited"]
    for life in exited:
        violations.append(f"worker process {life.pid} exited by itself (code {life.exit_code})")
    never_killed = [life for life in lives if life.end_reason != "killed"]
    same_pids = all(life.end_reason == "stopped" for life in never_killed)
    runs_by_pid: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        runs_by_pid[run.pid].append(run.start)
    # -- overlapping runs ---------------------------------------------------------------
    abandoned, cancelled = worker_log_marks(all_logs)
    overlaps = find_overlaps(
        runs, faults, process_deaths(lives, faults), abandoned, cancelled, host_stalls=host_stalls
    )
    overlap_summary = summarise_overlaps(overlaps)
    bad_overlaps = [o for o in overlaps if o["verdict"] == "violation"]
    hang_runs = [run for run in runs if run.kind in HANG_KINDS]
    life_of = {life.pid: life for life in lives}
    # A hung handler holds its worker until its process ends, or until the
    # process notices the job's lease was lost and gives the worker back.
    releases: dict[tuple[int, str], list[float]] = defaultdict(list)
    for pid, text in logs.items():
        for match in RELEASE_LINE.finditer(text):
            at = dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").timestamp()
            releases[(pid, match[3])].append(at + int(match[2]) / 1000)
    holds: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for run in hang_runs:
        life = life_of.get(run.pid)
        held_until = (life.ended or end_time) if life else end_time
        for at in releases.get((run.pid, run.job_id), []):
            if at >= run.start - 1:
                held_until = min(held_until, at)
        holds[run.pid].append((run.start, held_until))

    def hung_workers(pid: int, at: float) -> int:
        return sum(1 for start, until in holds.get(pid, []) if start <= at < until)

    def all_slots_hung(pid: int, at: float) -> bool:
        """Every worker of the process runs a handler that never returns."""
        return hung_workers(pid, at) >= workers

    not_recovered: list[dict[str, Any]] = []
    recover_max = 0.0
    slowest: dict[str, Any] = {}
    checked = 0
    for fault in faults:
        if fault.kind not in DB_FAULTS:
            continue
        for life in lives:
            life_end = life.ended or end_time
            if life.started > fault.start or life_end < fault.end + 10:
                continue
            paused = any(
                f.kind == "pause" and f.start <= fault.end + 5 and f.end >= fault.start
                for f in faults_by_pid.get(life.pid, [])
            )
            if paused or all_slots_hung(life.pid, fault.end):
                continue
            checked += 1
            pid_starts = runs_by_pid.get(life.pid, [])
            k = bisect.bisect_right(pid_starts, fault.end)
            if k < len(pid_starts) and pid_starts[k] <= life_end:
                if pid_starts[k] - fault.end > recover_max:
                    recover_max = pid_starts[k] - fault.end
                    slowest = {"fault": fault.index, "kind": fault.kind, "pid": life.pid}
            else:
                not_recovered.append({"fault": fault.index, "kind": fault.kind, "pid": life.pid})
    for item in not_recovered:
        violations.append(f"worker {item['pid']} ran no job after {item['kind']} #{item['fault']}")

    # -- hung handlers -----------------------------------------------------------------------
    hang_jobs = [job for job in planned if job.kind in HANG_KINDS]
    reported = [job for job in hang_jobs if f"job {job.job_id} has been running for" in all_logs]
    held_process: list[dict[str, Any]] = []
    for run in hang_runs:
        life = life_of.get(run.pid)
        if life is None:
            continue
        life_end = life.ended or end_time
        if life_end - run.start < 5 or all_slots_hung(run.pid, run.start):
            continue
        later_runs = [s for s in runs_by_pid.get(run.pid, []) if run.start + 1 < s <= life_end]
        if not later_runs:
            held_process.append({"job_id": run.job_id, "pid": run.pid})
    # A hung handler must hold one worker slot. One whose lease was lost (its
    # process was paused past the lease) keeps hanging in that process while
    # its job is recovered and run again elsewhere: one job, several slots.
    # Enough of them leave a process with no free worker at all.
    blocked: list[dict[str, Any]] = []
    for pid, spans in holds.items():
        edges = sorted([(start, 1) for start, _ in spans] + [(until, -1) for _, until in spans])
        count, since = 0, None
        for at, step in edges:
            count += step
            if count >= workers and since is None:
                since = at
            elif count < workers and since is not None:
                if at - since >= 5:
                    on_pid = [r for r in hang_runs if r.pid == pid and r.start <= at]
                    lease_lost = [
                        r
                        for r in on_pid
                        if any(
                            o.attempt > r.attempt and o.start <= at for o in runs_by_job[r.job_id]
                        )
                    ]
                    blocked.append(
                        {
                            "pid": pid,
                            "workers": workers,
                            "from": round(since - times["start"], 1),
                            "to": round(at - times["start"], 1),
                            "lease_lost": len(lease_lost),
                        }
                    )
                since = None
    recovered_after_kill = 0
    not_recovered_hang: list[dict[str, Any]] = []
    for fault in faults:
        if fault.kind not in ("kill", "kill_hung_holder"):
            continue
        for job in hang_jobs:
            before_kill = [r for r in runs_by_job.get(str(job.job_id), []) if r.start < fault.start]
            if not before_kill:
                continue
            run = max(before_kill, key=lambda r: r.attempt)  # the job's current run
            if run.pid != fault.pid:
                continue  # only a zombie of it died: the job runs elsewhere
            again = [r for r in runs_by_job[run.job_id] if r.start > fault.start]
            if again:
                recovered_after_kill += 1
            elif end_time - fault.start > lease + grace + 15:
                not_recovered_hang.append({"job_id": run.job_id, "fault": fault.index})
    for job in hang_jobs:
        if job not in reported and any(r.job_id == job.job_id for r in hang_runs):
            violations.append(f"hung job {job.job_id} was never reported in a worker log")
    for item in held_process:
        violations.append(f"hung job {item['job_id']} stopped process {item['pid']} running jobs")
    for item in blocked:
        violations.append(
            f"process {item['pid']} had all {item['workers']} workers held by hung handlers "
            f"from +{item['from']}s to +{item['to']}s ({item['lease_lost']} of them had lost "
            "their lease: their job was recovered and run again elsewhere)"
        )
    for item in not_recovered_hang:
        violations.append(
            f"hung job {item['job_id']} was not recovered after kill #{item['fault']}"
        )

    # -- recurring schedules -------------------------------------------------------------------
    unattended = [
        (int(a * 1000), int(b * 1000))
        for a, b in unattended_spans(lives, faults, times["start"], end_time)
    ]
    schedules = analyse_recurring(
        recurring or [],
        rows,
        runs_by_job,
        fire_seen or {},
        grace_ms=int(recurring_grace * 1000),
        ahead_ms=int(schedule_ahead * 1000),
        unattended=unattended,
    )
    for schedule_check in schedules:
        violations.extend(recurring_violations(schedule_check))

    # -- partition order ------------------------------------------------------------------------
    order = analyse_order(runs, rows, planned, faults, logs, abandoned | cancelled)
    violations.extend(order_verdicts(order))

    # -- verdict -------------------------------------------------------------------------------
    if lost:
        violations.append(f"{len(lost)} lost jobs")
    if wrong:
        violations.append(f"{len(wrong)} jobs with a wrong outcome")
    if unexplained:
        frozen_by = sorted({d["during_sqlite_freeze_by_pause"] for d in unexplained} - {None})
        during = sum(1 for d in unexplained if d["during_sqlite_freeze_by_pause"] is not None)
        note = (
            f" ({during} of them while a paused process held SQLite's write lock, so no "
            f"process could renew a lease: pause faults {', '.join(f'#{i}' for i in frozen_by)})"
            if during
            else ""
        )
        violations.append(
            f"{len(unexplained)} duplicate runs not explained by a kill/pause of their "
            f"process{note}"
        )
    if bad_overlaps:
        outlived = overlap_summary["async_outlived_resume"]
        violations.append(
            f"{len(bad_overlaps)} overlapping runs of one job not explained by a SIGSTOP of "
            f"the older run's process or an abandoned sync handler"
            + (
                f" ({outlived} of them async runs that outlived their resume by more than "
                f"{RESUME_SLACK * 1000:.0f} ms)"
                if outlived
                else ""
            )
        )
    if same_attempt:
        violations.append(f"{len(same_attempt)} jobs ran the same attempt twice")
    if success_without_run:
        violations.append(f"{len(success_without_run)} jobs succeeded without a completed run")
    if unexpected_runs:
        violations.append(f"{len(unexpected_runs)} jobs ran that must never run")
    if unknown_rows:
        violations.append(f"{len(unknown_rows)} job rows nobody enqueued")
    log_counts = {name: all_logs.count(text) for name, text in LOG_PATTERNS.items()}
    log_counts["other ERROR lines"] = sum(
        1
        for line in all_logs.splitlines()
        if " ERROR " in line
        and "failed on attempt" not in line
        and not any(text in line for text in LOG_PATTERNS.values())
    )
    fault_counts = Counter(f.kind for f in faults)
    zombie_hangs = sum(
        1
        for run in hang_runs
        if any(r.start > run.start and r.pid != run.pid for r in runs_by_job[run.job_id])
        and life_of.get(run.pid) is not None
        and life_of[run.pid].end_reason != "killed"
    )
    return {
        "db": vendor,
        "profile": profile,
        "seed": seed,
        "processes": processes,
        "processes_each": processes_each,
        "workers_per_process": workers,
        "lease_seconds": lease,
        "grace_seconds": grace,
        "duration_seconds": round(end_time - times["start"], 1),
        "load_seconds": round(times["load_end"] - times["load_start"], 1),
        "drain_seconds": round(times["drained"] - times["load_end"], 1),
        "jobs": {
            "enqueued": len(planned),
            "extra_rows_from_retried_enqueues": len(extra_rows),
            "unknown_rows": len(unknown_rows),
            "succeeded": stages["success"],
            "failed": stages["failed"],
            "failed_by_reason": dict(failed_by_reason),
            "hung_pending": hung_pending,
            "expected": dict(expected),
            "corrupted": sum(1 for job in planned if job.corrupted_at is not None),
            "lost": len(lost),
            "wrong_outcome": len(wrong),
            "success_without_run": len(success_without_run),
            "unexpected_runs": len(unexpected_runs),
            "by_api": dict(Counter(job.api for job in planned)),
            "by_kind": dict(Counter(job.kind for job in planned)),
        },
        "handler_runs": len(runs),
        "duplicates": {
            "total": len(duplicates),
            "explained_by_kill_or_pause": sum(
                1 for d in duplicates if d["fault"] is not None and not d["deadline_stop"]
            ),
            "explained_by_deadline_stop": sum(1 for d in duplicates if d["deadline_stop"]),
            "explained_by_host_stall": sum(1 for d in duplicates if d["host_stall"] is not None),
            "unexplained": len(unexplained),
            "same_attempt_twice": len(same_attempt),
            "by_fault_kind": dict(Counter(d["fault_kind"] for d in duplicates if d["fault"])),
            "max_recovery_seconds_by_fault_kind": {
                k: round(v, 2) for k, v in recovery_by_kind.items()
            },
        },
        "overlapping_runs": overlap_summary,
        "recurring": {
            "missed_grace_seconds": recurring_grace,
            "unattended_spans": unattended,
            "schedules": schedules,
        },
        "order": order,
        "faults": {
            "count": len(faults),
            "by_kind": dict(fault_counts),
            "injection_errors": injection_errors,
            "events": fault_rows,
        },
        "host_stalls": [
            {"at": round(s.start - times["start"], 2), "seconds": round(s.seconds, 2)}
            for s in host_stalls or []
        ],
        "longest_wait_after_fault": {"seconds": round(longest[0], 3), "fault": longest[1]},
        "processes_report": {
            "lives": len(lives),
            "restarted_after_kill": sum(1 for life in lives if life.end_reason == "killed"),
            "exited_by_themselves": len(exited),
            "needed_sigkill_at_stop": [life.pid for life in forced],
            "unkilled_processes_kept_their_pid": same_pids,
            "db_fault_recoveries_checked": checked,
            "not_recovered_after_db_fault": not_recovered,
            "max_first_job_after_db_fault_seconds": round(recover_max, 3),
            "slowest_recovery": slowest,
        },
        "hung_handlers": {
            "jobs": len(hang_jobs),
            "reported_in_logs": len(reported),
            "runs": len(hang_runs),
            "held_the_process": len(held_process),
            "processes_with_every_worker_hung": blocked,
            "recovered_after_kill": recovered_after_kill,
            "not_recovered_after_kill": len(not_recovered_hang),
            "left_running_in_a_resumed_process": zombie_hangs,
        },
        "producer": producer,
        "log_counts": log_counts,
        "violations": violations,
        "details": {
            "lost": lost[:MAX_DETAILS],
            "wrong_outcome": wrong[:MAX_DETAILS],
            "unexplained_duplicates": unexplained[:MAX_DETAILS],
            "same_attempt_twice": same_attempt[:MAX_DETAILS],
            "unexplained_overlaps": bad_overlaps[:MAX_DETAILS],
            "success_without_run": success_without_run[:MAX_DETAILS],
            "unexpected_runs": unexpected_runs[:MAX_DETAILS],
            "unknown_rows": unknown_rows[:MAX_DETAILS],
            "order_violations": order["list"][:MAX_DETAILS],
            "partitioned_runs_not_stored_unexplained": order["not_stored_unexplained"][
                :MAX_DETAILS
            ],
            "partitioned_enqueue_order": order["enqueue_order_problems"][:MAX_DETAILS],
            "extra_rows": extra_rows[:MAX_DETAILS],
        },
        "passed": not violations,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _overlap_side(side: dict[str, Any], t0: float) -> str:
    end = "-" if side["end"] is None else f"{side['end'] - t0:.2f}"
    how = {"process died": "killed", "still running": "running"}.get(
        side["end_by"], side["outcome"] or "?"
    )
    return f"{side['attempt']:>3} {side['pid']:>7} {side['start'] - t0:7.2f} {end:>7} {how:<9}"


def _overlap_lines(summary: dict[str, Any], t0: float) -> list[str]:
    """The overlap line of the report, and a table of the overlaps (violations first)."""
    worst = summary["max_async_end_after_resume_ms"]
    lines = [
        f"overlapping runs   {summary['total']:>8}   (frozen by SIGSTOP: {summary['frozen']}, "
        f"abandoned sync handlers: {summary['abandoned']}, NOT explained: "
        f"{summary['unexplained']}; async runs ended after resume: max "
        f"{'-' if worst is None else f'{worst:.0f}'} ms)"
    ]
    if not summary["list"]:
        return lines
    rows = sorted(summary["list"], key=lambda o: (o["verdict"] != "violation", o["from"]))
    shown = rows[:MAX_OVERLAP_ROWS]
    side = f"{'att':>3} {'pid':>7} {'start':>7} {'end':>7} {'outcome':<9}"
    lines.append(
        f"  {'job':<26} {'kind':<14} | older: {side} | newer: {side} | {'fault':>5}  verdict"
    )
    for o in shown:
        fault = f"#{o['fault']}" if o["fault"] is not None else "-"
        lines.append(
            f"  {o['job_id']:<26} {o['kind'] + ' ' + o['older']['mode']:<14} | older: "
            f"{_overlap_side(o['older'], t0)} | newer: {_overlap_side(o['newer'], t0)} | "
            f"{fault:>5}  {o['verdict']}: {o['why']}"
        )
    if len(rows) > len(shown):
        lines.append(f"  ... {len(rows) - len(shown)} more in the JSON report")
    return lines


def _recurring_lines(section: dict[str, Any] | None) -> list[str]:
    """The recurring schedules' table: one row of counts per schedule."""
    if not section or not section["schedules"]:
        return []
    grace = section["missed_grace_seconds"]
    lines = [
        f"recurring schedules {len(section['schedules']):>7}   (occurrences from later_job; a "
        f"gap is allowed only where no worker process ran for more than {grace:g}s)",
        f"  {'schedule':<20} {'cron':<15} {'expected':>8} {'enqueued':>8} {'ran':>5} "
        f"{'cancelled':>9} {'retried':>7} {'dups':>5} {'missing':>7} {'off-grid':>8} "
        f"{'early':>5} {'not-run':>7} {'max lag':>8}",
    ]
    for c in section["schedules"]:
        counts = c["counts"]
        lag = "-" if c["max_start_lag_ms"] is None else f"{c['max_start_lag_ms']}ms"
        other = sum(
            n
            for kind, n in counts.items()
            if kind not in ("duplicate", "missing", "off_grid", "early", "not_run")
        )
        lines.append(
            f"  {c['identifier']:<20} {c['cron']:<15} {c['expected']:>8} {c['enqueued']:>8} "
            f"{c['ran']:>5} {c['cancelled']:>9} {c['retried']:>7} {c['duplicates']:>5} "
            f"{c['missing']:>7} {counts['off_grid']:>8} {counts['early']:>5} "
            f"{counts['not_run']:>7} {lag:>8}"
            + (f"  (+{other} other problems, listed below)" if other else "")
            + (f"  ({c['missing_allowed']} gaps allowed)" if c["missing_allowed"] else "")
        )
    return lines


def _order_lines(order: dict[str, Any] | None) -> list[str]:
    """The order line: pairs of stored runs compared in partition order, and
    what became of the runs whose outcome was not stored."""
    if order is None:
        return []
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(order["not_stored_by_reason"].items()))
    return [
        f"order checks       {order['pairs']:>8}   violations {order['violations']}   "
        f"({order['partitioned_jobs']} partitioned jobs, {order['stored_runs']} stored runs in "
        f"{order['partitions']} partitions; enqueue order broken: "
        f"{len(order['enqueue_order_problems'])})",
        f"  runs not stored  {order['not_stored']:>8}   ({reasons or 'none'})",
    ]


def _host_stall_line(stalls: list[dict[str, float]]) -> str:
    text = ", ".join(f"{s['seconds']:.1f}s at +{s['at']:.1f}s" for s in stalls[:5])
    more = f" and {len(stalls) - 5} more" if len(stalls) > 5 else ""
    return (
        f"host stalls        {len(stalls):>8}   (a process that only sleeps woke a second or more "
        f"late{': ' + text + more if stalls else ''})"
    )


def render(result: dict[str, Any], t0: float) -> str:
    jobs, dups, procs, hung = (
        result["jobs"],
        result["duplicates"],
        result["processes_report"],
        result["hung_handlers"],
    )
    expect = jobs["expected"]
    lines = [
        f"later chaos report: db={result['db']} profile={result['profile']} "
        f"seed={result['seed']} processes={result['processes']}"
        f"{'x' + str(result['processes_each']) if result.get('processes_each', 1) > 1 else ''}"
        f"x{result['workers_per_process']} "
        f"lease={result['lease_seconds']}s grace={result['grace_seconds']}s",
        f"  duration {result['duration_seconds']}s (load {result['load_seconds']}s, "
        f"drain {result['drain_seconds']}s), {result['handler_runs']} handler runs",
        "",
        f"jobs enqueued      {jobs['enqueued']:>8}   (+{jobs['extra_rows_from_retried_enqueues']}"
        f" rows from enqueues retried after an ambiguous commit)",
        f"  succeeded        {jobs['succeeded']:>8}   (expected {expect.get('success', 0)})",
        f"  failed           {jobs['failed']:>8}   (expected {expect.get('failed', 0)}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(jobs["failed_by_reason"].items()))
        + ")",
        f"  hung (running)   {jobs['hung_pending']:>8}   (expected {expect.get('running', 0)})",
        f"  lost             {jobs['lost']:>8}",
        f"  wrong outcome    {jobs['wrong_outcome']:>8}",
        f"  corrupted payloads {jobs['corrupted']}, succeeded without a run "
        f"{jobs['success_without_run']}, ran but must not {jobs['unexpected_runs']}, "
        f"unknown rows {jobs['unknown_rows']}",
        f"duplicate runs     {dups['total']:>8}   (explained by a kill/pause of their process: "
        f"{dups['explained_by_kill_or_pause']}, by a stop at the lease deadline during a "
        f"database fault: {dups['explained_by_deadline_stop']}, by a stall of the whole "
        f"host: {dups['explained_by_host_stall']}, NOT explained: "
        f"{dups['unexplained']}; "
        f"same attempt twice: {dups['same_attempt_twice']})",
        f"  by fault kind    {dups['by_fault_kind']}; max time to re-run an interrupted job "
        f"{dups['max_recovery_seconds_by_fault_kind']}",
        *_overlap_lines(result["overlapping_runs"], t0),
        *_recurring_lines(result.get("recurring")),
        *_order_lines(result.get("order")),
        _host_stall_line(result.get("host_stalls", [])),
        f"longest wait after a fault: {result['longest_wait_after_fault']['seconds']:.2f}s "
        f"(fault #{result['longest_wait_after_fault']['fault']})",
        "",
        f"faults: {result['faults']['count']} {result['faults']['by_kind']}",
        "   #  kind              at       for   dups  first-start  ready-wait  detail",
    ]
    for f in result["faults"]["events"]:
        lines.append(
            f"  {f['index']:>2}  {f['kind']:<16} {f['start'] - t0:7.1f}s "
            f"{f['end'] - f['start']:6.2f}s"
            f" {f['duplicates']:>5}  {_fmt(f['first_start_after']):>11}  "
            f"{_fmt(f['max_ready_wait_after']):>10}  {f['detail']}{'' if f['ok'] else ' (FAILED)'}"
        )
    lines += [
        "",
        f"worker processes: {procs['lives']} lives, {procs['restarted_after_kill']} killed and "
        f"restarted, {procs['exited_by_themselves']} exited by themselves; unkilled processes "
        f"kept their PID to the end: "
        f"{'yes' if procs['unkilled_processes_kept_their_pid'] else 'NO'}",
        f"  recovered from database faults by themselves: "
        f"{procs['db_fault_recoveries_checked'] - len(procs['not_recovered_after_db_fault'])}/"
        f"{procs['db_fault_recoveries_checked']} (slowest first job after a fault "
        f"{procs['max_first_job_after_db_fault_seconds']:.2f}s: {procs['slowest_recovery']})",
        f"hung handlers: {hung['jobs']} jobs, {hung['runs']} runs, reported in logs "
        f"{hung['reported_in_logs']}/{hung['jobs']}, held a whole process "
        f"{hung['held_the_process']}, every worker of a process hung "
        f"{len(hung['processes_with_every_worker_hung'])}, "
        f"recovered after kill {hung['recovered_after_kill']} (not recovered "
        f"{hung['not_recovered_after_kill']}), left hanging after a lost lease "
        f"{hung['left_running_in_a_resumed_process']}",
        f"producer: {result['producer']}",
        f"worker logs: {result['log_counts']}",
        "",
    ]
    if result["violations"]:
        lines.append("VIOLATIONS:")
        lines += [f"  - {v}" for v in result["violations"]]
        for name, items in result["details"].items():
            if items and name != "extra_rows":
                lines.append(f"  {name} (first {len(items)}):")
                lines += [f"    {item}" for item in items]
        for checked in result.get("recurring", {}).get("schedules", []):
            for kind, items in checked["problems"].items():
                if items:
                    lines.append(
                        f"  recurring {checked['identifier']} {kind} (first "
                        f"{min(len(items), MAX_DETAILS)}):"
                    )
                    lines += [f"    {item}" for item in items[:MAX_DETAILS]]
        lines.append("RESULT: FAIL")
    else:
        lines.append(
            "RESULT: PASS (0 lost, 0 wrong outcomes, every duplicate and overlap explained)"
        )
    return "\n".join(lines)


def write_logs_tail(lives: list[Life], out: Path) -> None:
    """Concatenate the worker logs into one file next to the report."""
    with open(out, "w") as fh:
        for life in lives:
            fh.write(f"===== slot {life.slot} pid {life.pid} ({life.end_reason}) =====\n")
            if life.log.exists():
                fh.write(life.log.read_text(errors="replace"))
