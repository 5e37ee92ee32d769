"""Unique jobs (docs/how-to/unique-jobs.md) on both databases: a duplicate enqueue
writes nothing and returns the holder's id; the key is freed by finish,
cancel and rollback; unique_for holds it over finished jobs in its window;
concurrent enqueuers in separate transactions and processes never both get in."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connections, transaction

import later_django as later
from later_django import events, registry
from later_django.db import dialect_for
from later_django.exceptions import JobNotFound
from later_django.testing import drain
from tests.helpers import PROJECT_DIR, set_later, wait_until
from tests.jobapp.jobs import Digest, Noop, Ordered, Refresh
from tests.jobapp.unique_processes import ACCOUNT

HOUR = dt.timedelta(hours=1)
ENQUEUERS, CALLS = 8, 1000


class Rollback(Exception):
    pass


def rows_of_key(later_db, key: str) -> list[tuple[object, ...]]:
    return later_db.rows("SELECT id, stage FROM later_job WHERE unique_key = %s ORDER BY id", [key])


def test_a_duplicate_writes_nothing_and_returns_the_holders_id(later_db):
    told: list[events.Event] = []
    unsubscribe = [
        events.subscribe(told.append, events.JobEnqueued),
        events.subscribe(told.append, events.JobDuplicate),
    ]
    try:
        first = later.enqueue(Refresh(account=1))
        again = later.enqueue(Refresh(account=1, n=2), priority=5)
        delayed = later.enqueue(Refresh(account=1, n=3), delay=HOUR)
        other = later.enqueue(Refresh(account=2))
    finally:
        for stop in unsubscribe:
            stop()
    assert not first.duplicate and not other.duplicate
    assert again == first and again.duplicate
    assert delayed == first and delayed.duplicate
    assert other != first
    assert rows_of_key(later_db, "account-1") == [(first, "enqueued")]
    assert later_db.job_count() == 2
    info = later.get_job(first)
    assert info is not None and info.unique_key == "account-1" and info.priority == 0
    assert [type(e).__name__ for e in told] == [
        "JobEnqueued",
        "JobDuplicate",
        "JobDuplicate",
        "JobEnqueued",
    ]
    assert told[1].job_id == first  # type: ignore[attr-defined]


def test_an_enqueue_key_overrides_the_types_and_any_type_can_take_one(later_db):
    own = later.enqueue(Refresh(account=1), unique_key="mine")
    assert later.enqueue(Refresh(account=9), unique_key="mine") == own
    # The type's own key is free: the call's key replaced it.
    assert not later.enqueue(Refresh(account=1)).duplicate
    plain = later.enqueue(Noop(n=1), unique_key="mine")
    assert plain != own, "keys are per type"
    assert later.enqueue(Noop(n=2), unique_key="mine") == plain


def test_the_key_is_freed_by_finish_cancel_and_rollback(later_db):
    first = later.enqueue(Refresh(account=1))
    assert later.cancel(first) is True
    second = later.enqueue(Refresh(account=1))
    assert second != first and not second.duplicate
    assert [run.job_id for run in drain()] == [second]
    assert later_db.stage_of(second) == "success"
    third = later.enqueue(Refresh(account=1))
    assert third not in (first, second)
    later.cancel(third)
    with pytest.raises(Rollback), transaction.atomic(using=later_db.alias):
        rolled_back = later.enqueue(Refresh(account=1))
        assert later.enqueue(Refresh(account=1)) == rolled_back
        raise Rollback
    fourth = later.enqueue(Refresh(account=1))
    assert fourth != rolled_back and not fourth.duplicate
    assert [row[1] for row in rows_of_key(later_db, "account-1")] == [
        "cancelled",
        "success",
        "cancelled",
        "enqueued",
    ]


def test_unique_for_holds_the_key_over_finished_jobs_in_its_window(later_db):
    digest = later.enqueue(Digest(n=1))
    assert [run.job_id for run in drain()] == [digest]
    again = later.enqueue(Digest(n=2))
    assert again == digest and again.duplicate, "finished, but in the window"
    # The window's start is a multiple of its length on the database's clock.
    slot = int(later_db.job_field(digest, "unique_slot_ms"))  # type: ignore[arg-type]
    assert slot % 3_600_000 == 0 and slot <= later_db.now_ms() < slot + 3_600_000
    # A window of its own per call: a short one runs out.
    short = dt.timedelta(milliseconds=200)
    first = later.enqueue(Noop(n=1), unique_key="tick", unique_for=short)
    drain()
    ids = {first}

    def next_window() -> bool:
        ids.add(later.enqueue(Noop(n=2), unique_key="tick", unique_for=short))
        return len(ids) == 2

    wait_until(next_window, 5, "a new window to take the key again")
    assert [row[1] for row in rows_of_key(later_db, "tick")] == ["success", "enqueued"]


def test_unique_for_also_refuses_while_an_older_job_is_unfinished(later_db):
    """An unfinished job of the key holds it whatever its window."""
    held = later.enqueue(Noop(n=1), unique_key="k")
    assert later.enqueue(Noop(n=2), unique_key="k", unique_for=HOUR) == held


def test_enqueue_many_reports_which_were_duplicates(later_db):
    held = later.enqueue(Refresh(account=1))
    ids = later.enqueue_many(
        [Refresh(account=1), Refresh(account=2), Noop(n=3), Refresh(account=2)]
    )
    assert [job_id.duplicate for job_id in ids] == [True, False, False, True]
    assert ids[0] == held and ids[3] == ids[1]
    assert later_db.job_count() == 3
    # The call's key, given to every payload: the first takes it.
    keyed = later.enqueue_many([Noop(n=1), Noop(n=2)], unique_key="batch")
    assert keyed[1] == keyed[0] and [i.duplicate for i in keyed] == [False, True]


def test_a_unique_continuation_of_a_missing_parent_raises_and_writes_nothing(later_db):
    count = later_db.job_count()
    with pytest.raises(JobNotFound):
        later.enqueue(Refresh(account=1), after="01" + "a" * 24)
    assert later_db.job_count() == count
    parent = later.enqueue(Noop(n=1))
    child = later.enqueue(Refresh(account=1), after=parent)
    assert later_db.stage_of(child) == "waiting"
    assert later.enqueue(Refresh(account=1), after=parent) == child
    assert later.enqueue(Refresh(account=1)) == child, "a waiting job holds its key"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: later.enqueue(Noop(), unique_key=5), TypeError, "unique_key must be a str"),
        (lambda: later.enqueue(Noop(), unique_key=""), ValueError, "unique_key has 0 characters"),
        (lambda: later.enqueue(Noop(), unique_key="k" * 256), ValueError, "1 to 255"),
        (lambda: later.enqueue(Noop(), unique_for=HOUR), TypeError, "unique_for needs a"),
        (
            lambda: later.enqueue(Noop(), unique_key="k", unique_for=dt.timedelta(0)),
            ValueError,
            "unique_for=.* is not positive",
        ),
        (
            lambda: later.enqueue(Noop(), unique_key="k", unique_for=dt.timedelta(days=2)),
            ValueError,
            r"longer than LATER\['DASHBOARD_RETENTION'\] \(86400000 ms\)",
        ),
        (
            lambda: later.enqueue_many([Noop(), Noop()], unique_for=HOUR),
            TypeError,
            r"^payloads\[0\]: unique_for needs",
        ),
        (
            lambda: later.enqueue(Noop(), unique_key="k", after=["01" + "a" * 24, "01" + "b" * 24]),
            TypeError,
            "unique_key does not apply to a fan-in job",
        ),
    ],
)
def test_bad_unique_options_raise_naming_the_fix_and_write_nothing(later_db, call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert later_db.job_count() == 0


def test_a_partition_job_takes_no_unique_key(later_db, settings):
    """A partition runs every job it is given, in order."""
    set_later(settings, TOPICS={"ordered": 2})
    with pytest.raises(TypeError, match="unique_key does not apply to a partition job"):
        later.enqueue_to_partition(Ordered(key="a", n=1), unique_key="k")
    assert later_db.job_count() == 0


def test_a_key_callable_that_returns_no_str_fails_the_enqueue_and_writes_nothing(later_db):
    from dataclasses import dataclass

    @dataclass
    class BadKey:
        n: int

    def handle(ctx: later.JobContext, payload: BadKey) -> None:
        pass

    handle.__annotations__["payload"] = BadKey
    later.job(unique_key=lambda payload: payload.n)(handle)
    try:
        with pytest.raises(TypeError, match="the unique_key callable of .*BadKey must be a str"):
            later.enqueue(BadKey(n=1))
        with pytest.raises(TypeError, match=r"^payloads\[0\]: the unique_key callable"):
            later.enqueue_many([BadKey(n=1)])
    finally:
        registry.unregister(BadKey)
    assert later_db.job_count() == 0


def test_job_refuses_unique_options_it_cannot_honour():
    def handle(ctx: later.JobContext, payload: Noop) -> None:
        pass

    with pytest.raises(TypeError, match="unique_for needs a unique_key"):
        later.job(unique_for=HOUR)(handle)
    with pytest.raises(TypeError, match="unique_key must be a str or a callable"):
        later.job(unique_key=3)(handle)  # type: ignore[arg-type]

    def ordered(ctx: later.JobContext, payload: Ordered) -> None:
        pass

    with pytest.raises(TypeError, match="do not apply to a topic's jobs"):
        later.job(unique_key="k", topic="t")(ordered)


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_key_held_by_an_open_transaction_is_decided_when_it_ends(later_db, ending):
    """Another caller's uncommitted enqueue of the key makes this one wait
    for it: it gets that job's id if it commits, and writes its own if it
    rolls back. Never two jobs, never a refusal for a job that never was."""
    held, end = threading.Event(), threading.Event()
    holder: list[str] = []
    second: list[str] = []

    def hold() -> None:
        try:
            with transaction.atomic(using=later_db.alias):
                holder.append(later.enqueue(Refresh(account=1)))
                held.set()
                end.wait(20)
                if ending == "rollback":
                    raise Rollback
        except Rollback:
            pass
        finally:
            connections.close_all()

    def enqueue_again() -> None:
        try:
            second.append(later.enqueue(Refresh(account=1, n=2)))
        finally:
            connections.close_all()

    first = threading.Thread(target=hold)
    first.start()
    assert held.wait(10)
    waiter = threading.Thread(target=enqueue_again)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive(), "the second enqueue decided before the first transaction ended"
    end.set()
    first.join(10)
    waiter.join(20)
    assert second, "the second enqueue never returned"
    if ending == "commit":
        assert second[0] == holder[0] and second[0].duplicate  # type: ignore[attr-defined]
    else:
        assert second[0] != holder[0] and not second[0].duplicate  # type: ignore[attr-defined]
    assert rows_of_key(later_db, "account-1") == [(second[0], "enqueued")]


def test_retrying_a_failed_unique_job_waits_until_its_key_is_free(later_db):
    """An operator's retry does not put a second unfinished job on a key."""
    failed = later.enqueue(Refresh(account=1))
    later_db.execute(
        "UPDATE later_job SET stage = 'failed', finished_ms = 1, last_error = 'x' WHERE id = %s",
        [failed],
    )
    newer = later.enqueue(Refresh(account=1))
    assert newer != failed
    dialect = dialect_for(later_db.alias)

    def retry() -> int | None:
        with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
            return dialect.control.retry_failed(c, namespace="default", job_id=failed)

    assert retry() is None
    assert later_db.stage_of(failed) == "failed"
    later.cancel(newer)
    assert retry() == 0
    assert later_db.stage_of(failed) == "enqueued"
    assert later.enqueue(Refresh(account=1)) == failed


def test_concurrent_enqueuers_in_processes_make_exactly_one_job(later_db, tmp_path):
    """8 processes x 1,000 enqueues of one key, every fourth in a transaction
    that rolls back: exactly one job exists, and every call that committed
    got its id."""
    go = tmp_path / "go"
    procs = []
    for i in range(ENQUEUERS):
        out = tmp_path / f"out-{i}.json"
        with open(tmp_path / f"enqueuer-{i}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.jobapp.unique_processes", str(i), str(CALLS),
                     str(out), str(go)],
                    cwd=PROJECT_DIR,
                    env=later_db.worker_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )  # fmt: skip
    try:
        wait_until(
            lambda: all(Path(f"{tmp_path}/out-{i}.json.ready").exists() for i in range(ENQUEUERS)),
            60,
            "every enqueuer process to start",
        )
        go.touch()
        for i, proc in enumerate(procs):
            assert proc.wait(240) == 0, (tmp_path / f"enqueuer-{i}.log").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = rows_of_key(later_db, f"account-{ACCOUNT}")
    assert len(rows) == 1 and rows[0][1] == "enqueued"
    (job_id, _) = rows[0]
    committed, rolled_back = [], 0
    for i in range(ENQUEUERS):
        result = json.loads((tmp_path / f"out-{i}.json").read_text())
        committed += result["committed"]
        rolled_back += result["rolled_back"]
    assert len(committed) == ENQUEUERS * CALLS * 3 // 4
    assert rolled_back == ENQUEUERS * CALLS // 4
    assert set(committed) == {job_id}
    assert later.stage_counts()["enqueued"] == 1
