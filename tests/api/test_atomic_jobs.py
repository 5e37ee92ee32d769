"""Atomic jobs (``@job(atomic=True)``, docs/how-to/atomic-jobs.md): a sync handler's
writes on the LATER database commit with its job's success, in one
transaction, or not at all.

On both databases: the registry's refusals, the atomic run itself (its
fence, a failure, an abandoned attempt, SQLite's write lock), drain() and the
inline mode, and real ``later_worker`` processes (a failure and its retries,
one commit, kill -9, a timeout, a claim taken over, a handler that outlives
its lease, cancel(), partition heads).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connections, transaction

import later_django as later
from later_django import registry
from later_django.context import JobContext
from later_django.db import dialect_for
from later_django.db.base import TABLES
from later_django.db.rows import ClaimRequest
from later_django.ids import JobId
from later_django.testing import drain
from later_django.types import ClaimedJob
from later_django.worker.atomic import AtomicRunner, AttemptAbandoned, Committed
from tests.conftest import ALIASES
from tests.helpers import (
    STOP_TIMEOUT,
    LaterDb,
    history_stages,
    read_records,
    set_later,
    wait_until,
)
from tests.jobapp.jobs import (
    AtomicNested,
    AtomicNote,
    AtomicOrdered,
    AtomicOverrun,
    WriteNote,
    run_atomic_note,
)
from tests.jobapp.models import Note

OWNER = "atomic-test-owner"
LEASE_MS = 30_000
RETENTION_MS = 60_000
# Timings for processes whose dead or stopped claims must be recovered quickly.
SHORT_LEASE = {"LEASE_DURATION": 1, "STUCK_JOB_GRACE": 0.5, "MAINTENANCE_INTERVAL": 0.2}
PROCESS_TIMEOUT = 30.0  # seconds a worker process gets to bring a job where a test expects


def notes(later_db: LaterDb) -> list[tuple[str, int]]:
    """The committed Notes as (text, attempt), by text."""
    rows = Note.objects.using(later_db.alias).order_by("text")
    return list(rows.values_list("text", "attempt"))


def claim(later_db: LaterDb, job_id: str, owner: str = OWNER) -> ClaimedJob:
    """Claim the ready job ``job_id`` as a server named ``owner`` would."""
    request = ClaimRequest(namespace="default", owner=owner, limit=10, lease_ms=LEASE_MS)
    with connections[later_db.alias].cursor() as cursor:
        claimed = dialect_for(later_db.alias).hot.claim(cursor, request)
    (job,) = [job for job in claimed if job.id == job_id]
    return job


def run_atomic(
    later_db: LaterDb, job: ClaimedJob, payload: object, func: Callable[..., Any] | None = None
) -> Committed:
    """Run ``func`` (the registered handler by default) as the worker runs an
    atomic job of ``job``'s claim, in this thread."""
    runner = AtomicRunner(alias=later_db.alias, owner=OWNER, retention_ms=RETENTION_MS)
    ctx = JobContext(job_id=JobId(job.id), attempt=job.attempt)
    return runner.run(job, func or run_atomic_note, ctx, payload)


# -- the registry ------------------------------------------------------------------------


@dataclass
class AsyncAtomic:
    n: int = 0


def test_registry_refuses_atomic_on_an_async_handler():
    """An async handler cannot be atomic (its queries run outside the job's
    transaction): a TypeError at decoration, and nothing is registered."""

    async def handle(ctx: JobContext, payload: AsyncAtomic) -> None: ...

    with pytest.raises(TypeError, match=r"@job\(atomic=True\) of .*handle: an async handler") as e:
        later.job(atomic=True)(handle)
    assert "use a sync handler" in str(e.value)
    with pytest.raises(later.NotRegistered):
        registry.handler_for_payload(AsyncAtomic())


def test_registry_refuses_an_atomic_that_is_not_a_bool():
    """atomic takes True or False; anything else is refused before registering."""

    def handle(ctx: JobContext, payload: AsyncAtomic) -> None: ...

    with pytest.raises(TypeError, match=r"@job\(atomic=\.\.\.\) of .* must be True or False"):
        later.job(atomic="yes")(handle)  # type: ignore[call-overload]
    with pytest.raises(later.NotRegistered):
        registry.handler_for_payload(AsyncAtomic())


def test_registry_records_atomic_on_the_handler():
    """atomic=True is on the registered handler; a plain handler is not atomic."""
    assert registry.handler_for_payload(AtomicNote(text="x")).atomic is True
    assert registry.handler_for_payload(WriteNote(text="x")).atomic is False


@contextmanager
def writer_of_its_own(later_db: LaterDb) -> Iterator[Callable[[str, list[Any]], Any]]:
    """Yield ``write(sql, params)``: a write through a connection of its own
    that commits at once (another server's, as it were)."""
    if later_db.vendor == "sqlite":
        name = connections[later_db.alias].settings_dict["NAME"]
        conn = sqlite3.connect(name, isolation_level=None)
        try:
            yield lambda sql, params: conn.execute(sql.replace("%s", "?"), params)
        finally:
            conn.close()
        return
    import psycopg

    from later_django.db.postgresql import connect_kwargs

    with psycopg.connect(autocommit=True, **connect_kwargs(later_db.alias)) as pg:
        yield pg.execute


TAKE_OVER_SQL = (
    "UPDATE later_job SET lease_owner = 'another-server', attempts = attempts + 1 "
    "WHERE id = %s AND stage = 'running'"
)


# -- the atomic run, in this thread --------------------------------------------------------


def test_atomic_run_commits_the_writes_the_success_and_the_released_child(later_db):
    """The handler's Note, its job's success and its waiting continuation's
    release are stored by one run."""
    parent = later.enqueue(AtomicNote(text="together"))
    child = later.enqueue_continue(parent, WriteNote(text="child"))
    job = claim(later_db, parent)

    committed = run_atomic(later_db, job, AtomicNote(text="together"))

    assert committed == Committed(stored=True, released=1)
    assert notes(later_db) == [("together", 1)]
    assert later_db.stage_of(parent) == "success"
    assert later_db.job_field(parent, "lease_owner") is None
    assert later_db.stage_of(child) == "enqueued"


def test_atomic_run_rolls_back_when_another_server_took_the_claim(later_db):
    """The claim was taken over during the run (another server claimed the
    job again): the success's fence fails and the handler's writes roll back
    with it; the other server's claim is left as it is."""
    job_id = later.enqueue(AtomicNote(text="taken over"))
    job = claim(later_db, job_id)

    def taken_over_meanwhile(ctx: JobContext, payload: AtomicNote) -> None:
        run_atomic_note(ctx, payload)
        with writer_of_its_own(later_db) as write:
            write(TAKE_OVER_SQL, [job_id])

    if dialect_for(later_db.alias).single_writer:
        # No other connection can write while the run's transaction is
        # open: the claim is taken over before it begins (while the run
        # waits for the write lock, say).
        with writer_of_its_own(later_db) as write:
            write(TAKE_OVER_SQL, [job_id])
        committed = run_atomic(later_db, job, AtomicNote(text="taken over"))
    else:
        committed = run_atomic(later_db, job, AtomicNote(text="taken over"), taken_over_meanwhile)

    assert committed == Committed(stored=False)
    assert notes(later_db) == []
    assert later_db.stage_of(job_id) == "running"
    assert later_db.job_field(job_id, "lease_owner") == "another-server"
    assert later_db.job_field(job_id, "attempts") == 2


def test_atomic_run_rolls_back_a_handler_that_raises_and_stores_nothing(later_db):
    """A handler that raises after writing: its Note rolls back, the error
    propagates, and the job is still the claim's (its failure is stored
    afterwards, as any job's)."""
    job_id = later.enqueue(AtomicNote(text="raises", fail_until=1))
    job = claim(later_db, job_id)

    with pytest.raises(RuntimeError, match="attempt 1 fails after writing 'raises'"):
        run_atomic(later_db, job, AtomicNote(text="raises", fail_until=1))

    assert notes(later_db) == []
    assert later_db.stage_of(job_id) == "running"
    assert later_db.job_field(job_id, "lease_owner") == OWNER


def test_atomic_run_of_an_abandoned_attempt_rolls_back(later_db):
    """The worker stopped waiting for the attempt while its handler ran
    (``ctx.cancel_requested``): it returns normally, yet nothing commits."""
    job_id = later.enqueue(AtomicNote(text="abandoned"))
    job = claim(later_db, job_id)

    def abandoned_meanwhile(ctx: JobContext, payload: AtomicNote) -> None:
        run_atomic_note(ctx, payload)
        ctx.cancel_requested.set()  # as the worker does from its event loop

    with pytest.raises(AttemptAbandoned, match="the worker stopped waiting for this attempt"):
        run_atomic(later_db, job, AtomicNote(text="abandoned"), abandoned_meanwhile)

    assert notes(later_db) == []
    assert later_db.stage_of(job_id) == "running"


def test_atomic_run_reports_a_commit_hook_that_raises_after_the_commit(later_db, caplog):
    """A transaction.on_commit hook of the handler runs only once its job's
    success committed; one that raises then is logged, and the success stands."""
    job_id = later.enqueue(AtomicNote(text="hooked"))
    job = claim(later_db, job_id)
    seen: list[str] = []

    def with_hooks(ctx: JobContext, payload: AtomicNote) -> None:
        run_atomic_note(ctx, payload)
        transaction.on_commit(lambda: seen.append(later_db.stage_of(job_id)), using=later_db.alias)
        transaction.on_commit(lambda: 1 / 0, using=later_db.alias)

    with caplog.at_level(logging.ERROR, logger="later_django"):
        committed = run_atomic(later_db, job, AtomicNote(text="hooked"), with_hooks)

    assert committed == Committed(stored=True, released=0)
    assert seen == ["success"]
    assert notes(later_db) == [("hooked", 1)]
    assert "raised after its success committed" in caplog.text


def test_atomic_run_takes_sqlite_write_lock_first_whatever_the_transaction_mode(later_db):
    """On a single-writer database the run's transaction begins with the
    write lock taken, even where OPTIONS["transaction_mode"] is unset
    (deferred): a handler that reads before it writes then never fails to
    take the lock once another connection has committed."""
    if not dialect_for(later_db.alias).single_writer:
        pytest.skip("a database of many writers takes no database-wide write lock")
    db = connections[later_db.alias]
    options = db.settings_dict["OPTIONS"]
    mode = options.pop("transaction_mode")
    db.close()  # the next connection reads the settings again
    try:
        job_id = later.enqueue(AtomicNote(text="locked first"))
        job = claim(later_db, job_id)
        other = sqlite3.connect(db.settings_dict["NAME"], timeout=0, isolation_level=None)
        held: list[bool] = []

        def reads_then_writes(ctx: JobContext, payload: AtomicNote) -> None:
            Note.objects.using(later_db.alias).count()
            try:  # another connection commits after the read
                other.execute("BEGIN IMMEDIATE")
                other.execute("COMMIT")
                held.append(False)
            except sqlite3.OperationalError as exc:
                held.append("locked" in str(exc))
            run_atomic_note(ctx, payload)

        committed = run_atomic(later_db, job, AtomicNote(text="locked first"), reads_then_writes)
        other.close()
    finally:
        options["transaction_mode"] = mode
        db.close()

    assert held == [True]
    assert committed.stored
    assert notes(later_db) == [("locked first", 1)]


# -- drain() and the inline mode -----------------------------------------------------------


def _drain_until(predicate: Callable[[], bool], message: str) -> None:
    """drain() until ``predicate`` holds: a retry is due 50 ms after its failure."""

    def drained() -> bool:
        drain()
        return predicate()

    wait_until(drained, 5.0, message)


def test_drain_rolls_back_a_failed_atomic_attempt_and_commits_its_retry(later_db, record):
    """Under drain() (here in autocommit, as a test without a transaction),
    the failed attempt's Note is rolled back, the job is requeued by its
    policy, and its retry's Note commits with its success."""
    job_id = later.enqueue(AtomicNote(text="drained", fail_until=1))

    runs = drain()

    assert (runs[0].attempt, runs[0].outcome) == (1, "retry")
    assert ("drained", 1) not in notes(later_db)
    _drain_until(lambda: later_db.stage_of(job_id) == "success", "the retry succeeds")
    assert notes(later_db) == [("drained", 2)]
    assert [r.attempt for r in read_records(record, "atomic-wrote", job_id)] == [1, 2]


@pytest.mark.django_db(databases="__all__")
def test_drain_in_a_test_transaction_rolls_back_only_the_atomic_attempt(later_db_in_transaction):
    """Inside a test's transaction an atomic run is a savepoint: its failed
    attempt rolls back its own Note and keeps the test's rows."""
    alias = later_db_in_transaction
    Note.objects.using(alias).create(text="the test's own", job_id="-")
    job_id = later.enqueue(AtomicNote(text="in savepoint", fail_until=99))

    runs = drain()

    assert runs[0].outcome == "retry"
    texts = list(Note.objects.using(alias).values_list("text", flat=True))
    assert texts == ["the test's own"]
    info = later.get_job(job_id)
    assert info is not None and info.stage in ("requeued", "failed")


def test_drain_commits_an_atomic_job_whose_own_atomic_block_failed(later_db):
    """The handler's own transaction.atomic() nests in the job's as a
    savepoint: a failure it catches rolls back that block only."""
    job_id = later.enqueue(AtomicNested(text="nested"))

    assert [run.outcome for run in drain()] == ["succeeded"]

    assert notes(later_db) == [("nested", 1), ("nested (after)", 1)]
    assert later_db.stage_of(job_id) == "success"


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_inline_mode_runs_atomic_jobs_atomically(later_db, settings):
    """LATER["RUN_INLINE"]: an atomic job's failed attempt leaves no Note and
    is requeued; one that succeeds commits its Note with its success."""
    set_later(settings, RUN_INLINE=True)

    failed = later.enqueue(AtomicNote(text="inline fails", fail_until=99))
    succeeded = later.enqueue(AtomicNote(text="inline"))

    assert later_db.stage_of(failed) in ("requeued", "failed")  # by its retries' times
    assert later_db.stage_of(succeeded) == "success"
    assert notes(later_db) == [("inline", 1)]


@pytest.fixture(params=sorted(ALIASES), ids=sorted(ALIASES))
def later_db_in_transaction(request: pytest.FixtureRequest, settings: Any) -> str:
    """The SQLite or PostgreSQL alias as LATER's database, inside the test's
    transaction (as a django.test.TestCase's), its tables emptied there."""
    alias = ALIASES[request.param]
    if alias not in django_settings.DATABASES:
        pytest.skip("no PostgreSQL server could be started")
    set_later(settings, DATABASE=alias)
    with connections[alias].cursor() as cursor:
        for table in TABLES:  # jobs first: deleting them fires the counter triggers
            cursor.execute(f"DELETE FROM {table}")
    return alias


# -- real worker processes -------------------------------------------------------------


@pytest.mark.one_env
def test_worker_rolls_back_a_failed_atomic_attempt_and_follows_the_retry_policy(later_db, workers):
    """Each attempt writes its Note before it raises: no failed attempt's
    Note commits. One job succeeds on its retry with that attempt's Note;
    one that always fails ends failed after its policy's 4 attempts, with
    no Note."""
    proc = workers.start(workers=2)
    workers.wait_registered(proc)
    retried = later.enqueue(AtomicNote(text="retried", fail_until=1))
    always = later.enqueue(AtomicNote(text="always fails", fail_until=99))

    workers.wait_stage(retried, "success", PROCESS_TIMEOUT)
    workers.wait_stage(always, "failed", PROCESS_TIMEOUT)

    assert notes(later_db) == [("retried", 2)]
    assert [r.attempt for r in read_records(workers.record, "atomic-wrote", always)] == [1, 2, 3, 4]
    assert later_db.job_field(always, "attempts") == 4
    assert "attempt 4 fails after writing" in str(later_db.job_field(always, "last_error"))
    assert history_stages(later_db.job_row(retried)[2]) == [
        "enqueued", "running", "requeued", "enqueued", "running", "success",
    ]  # fmt: skip


@pytest.mark.one_env
def test_worker_commits_an_atomic_success_with_its_writes_in_one_commit(
    later_db, workers, tmp_path: Path
):
    """While the handler holds its transaction open after writing, a reader
    sees neither its Note, nor its success, nor its continuation released;
    then all three at once. Each look is one statement: one snapshot."""
    proc = workers.start(workers=2)
    workers.wait_registered(proc)
    gate = tmp_path / "gate"
    parent = later.enqueue(AtomicNote(text="one commit", hold_on=1, gate=str(gate)))
    child = later.enqueue_continue(parent, WriteNote(text="child of one commit"))
    look = (
        f"SELECT (SELECT COUNT(*) FROM {Note._meta.db_table} WHERE text = %s), "
        "(SELECT stage FROM later_job WHERE id = %s), (SELECT stage FROM later_job WHERE id = %s)"
    )

    def observe() -> tuple[int, str, str]:
        row = later_db.rows(look, ["one commit", parent, child])[0]
        return int(row[0]), str(row[1]), str(row[2])  # type: ignore[call-overload]

    wait_until(
        lambda: read_records(workers.record, "atomic-wrote", parent),
        PROCESS_TIMEOUT,
        lambda: f"the handler to write\n{workers.logs()}",
    )
    assert observe() == (0, "running", "waiting"), "written, not committed"
    gate.touch()
    seen = [observe()]
    wait_until(
        lambda: seen.append(observe()) or seen[-1][1] == "success",
        PROCESS_TIMEOUT,
        lambda: f"the job to succeed; seen {sorted(set(seen))}\n{workers.logs()}",
        interval=0.002,
    )

    states = {(note, stage, child_stage != "waiting") for note, stage, child_stage in seen}
    assert states <= {(0, "running", False), (1, "success", True)}, sorted(set(seen))
    workers.wait_stage(child, "success", PROCESS_TIMEOUT)
    assert notes(later_db) == [("child of one commit", 1), ("one commit", 1)]


@pytest.mark.one_env
def test_worker_killed_mid_atomic_handler_leaves_nothing_and_the_retry_writes_once(
    later_db, workers
):
    """kill -9 while the handler holds its written Note uncommitted: neither
    the Note nor a success is left; once the lease expires, another process
    retries the job and its Note commits once."""
    victim = workers.start(timings=SHORT_LEASE, workers=2)
    workers.wait_registered(victim)
    job_id = later.enqueue(AtomicNote(text="killed", hold_on=1, hold=60))
    wait_until(
        lambda: read_records(workers.record, "atomic-wrote", job_id),
        PROCESS_TIMEOUT,
        lambda: f"the handler to write\n{workers.logs()}",
    )

    os.kill(victim.pid, signal.SIGKILL)
    assert victim.proc.wait(STOP_TIMEOUT) == -signal.SIGKILL
    assert notes(later_db) == []
    assert later_db.job_row(job_id)[:2] == ("running", 1)

    survivor = workers.start(timings=SHORT_LEASE, workers=2)
    workers.wait_stage(job_id, "success", PROCESS_TIMEOUT)

    assert notes(later_db) == [("killed", 2)]
    wrote = read_records(workers.record, "atomic-wrote", job_id)
    assert [(r.attempt, r.pid) for r in wrote] == [(1, victim.pid), (2, survivor.pid)]
    assert history_stages(later_db.job_row(job_id)[2]) == [
        "enqueued", "running", "requeued", "enqueued", "running", "success",
    ]  # fmt: skip


@pytest.mark.one_env
def test_worker_rolls_back_an_atomic_attempt_that_ran_past_its_timeout(later_db, workers):
    """An attempt abandoned at its timeout returns later: it rolls back
    instead of committing, and the retry's Note is the one that commits."""
    proc = workers.start(workers=2)
    workers.wait_registered(proc)
    job_id = later.enqueue(AtomicOverrun(text="overran"))

    workers.wait_stage(job_id, "success", PROCESS_TIMEOUT)
    wait_until(
        lambda: len(read_records(workers.record, "atomic-returns", job_id)) == 2,
        PROCESS_TIMEOUT,
        "the abandoned attempt's handler to return too",
    )

    assert notes(later_db) == [("overran", 2)]
    assert "JobTimeout" in str(later_db.job_field(job_id, "last_error"))
    assert history_stages(later_db.job_row(job_id)[2]) == [
        "enqueued", "running", "requeued", "enqueued", "running", "success",
    ]  # fmt: skip


@pytest.mark.one_env
def test_worker_rolls_back_an_atomic_attempt_whose_claim_was_taken_over(
    later_db, workers, tmp_path: Path
):
    """Another server takes the job over while the handler holds its
    transaction open: when the handler returns, the success's fence fails
    and its writes roll back; the other server's claim is left as it is."""
    if dialect_for(later_db.alias).single_writer:
        pytest.skip(
            "a single writer: no other connection writes while the handler's "
            "transaction is open (test_worker_stops_an_atomic_handler_that_outlives_its_lease)"
        )
    proc = workers.start(workers=2)
    workers.wait_registered(proc)
    gate = tmp_path / "gate"
    job_id = later.enqueue(AtomicNote(text="taken over", hold_on=1, gate=str(gate)))
    wait_until(
        lambda: read_records(workers.record, "atomic-wrote", job_id),
        PROCESS_TIMEOUT,
        lambda: f"the handler to write\n{workers.logs()}",
    )

    taken = later_db.execute(TAKE_OVER_SQL, [job_id])
    gate.touch()
    wait_until(
        lambda: (
            "its writes rolled back" in proc.output() or "abandoned sync handler" in proc.output()
        ),
        PROCESS_TIMEOUT,
        lambda: f"the worker to let the attempt go\n{workers.logs()}",
    )

    assert taken == 1
    assert read_records(workers.record, "atomic-returns", job_id), "the handler returned"
    assert notes(later_db) == []
    assert later_db.job_row(job_id)[:2] == ("running", 2)
    assert later_db.job_field(job_id, "lease_owner") == "another-server"


@pytest.mark.one_env
def test_worker_stops_an_atomic_handler_that_outlives_its_lease(later_db, workers):
    """A 1 s lease and a handler holding its transaction for 3 s. Where one
    writer holds the whole database (SQLite), the server's renewals wait on
    the handler's own write lock: its claim is given up before the lease
    could expire, the handler rolls back when it returns, and the job runs
    again and commits; nothing waits for ever. Elsewhere the lease is
    renewed and the first attempt commits."""
    proc = workers.start(timings=SHORT_LEASE, workers=2)
    workers.wait_registered(proc)
    job_id = later.enqueue(AtomicNote(text="outlived", hold_on=1, hold=3.0))

    workers.wait_stage(job_id, "success", PROCESS_TIMEOUT)

    if dialect_for(later_db.alias).single_writer:
        assert notes(later_db) == [("outlived", 2)]
        assert "abandoned sync handler" in proc.output()
        assert [r.attempt for r in read_records(workers.record, "atomic-returns", job_id)] == [
            1,
            2,
        ]
    else:
        assert notes(later_db) == [("outlived", 1)]
        assert later_db.job_field(job_id, "attempts") == 1


@pytest.mark.one_env
def test_worker_runs_atomic_partition_heads_in_order(later_db, workers, settings):
    """A topic's atomic jobs: a head whose first attempt fails rolls its
    Note back and keeps its place; its retry's success, fenced by the
    partition's lease too, commits with its Note and lets the next head run."""
    topics = {"ordered": 2}
    set_later(settings, TOPICS=topics)
    proc = workers.start(workers=2, env={"LATER_TEST_SETTINGS": json.dumps({"TOPICS": topics})})
    workers.wait_registered(proc)
    with transaction.atomic(using=later_db.alias):
        ids = [
            later.enqueue_to_partition_in(AtomicOrdered("k", n, fail_first=n == 0))
            for n in range(3)
        ]

    for job_id in ids:
        workers.wait_stage(job_id, "success", PROCESS_TIMEOUT)

    assert notes(later_db) == [("k:0", 2), ("k:1", 1), ("k:2", 1)]
    wrote = read_records(workers.record, "atomic-wrote")
    assert [(r.tag, r.attempt) for r in wrote] == [("k:0", 1), ("k:0", 2), ("k:1", 1), ("k:2", 1)]


@pytest.mark.one_env
def test_worker_cancel_of_a_running_atomic_job_rolls_its_writes_back(
    later_db, workers, tmp_path: Path
):
    """cancel() of a running atomic job: its handler is told, and when it
    returns its writes roll back; the job ends cancelled, not succeeded."""
    if dialect_for(later_db.alias).single_writer:
        pytest.skip(
            "a single writer: cancel() waits for the write lock the running handler "
            "holds, so it comes after the handler's commit or rollback"
        )
    proc = workers.start(workers=2)
    workers.wait_registered(proc)
    gate = tmp_path / "gate"
    job_id = later.enqueue(AtomicNote(text="cancelled", hold_on=1, gate=str(gate)))
    wait_until(
        lambda: read_records(workers.record, "atomic-wrote", job_id),
        PROCESS_TIMEOUT,
        lambda: f"the handler to write\n{workers.logs()}",
    )

    assert later.cancel(job_id) is True
    wait_until(
        lambda: "was asked to stop (cancel)" in proc.output(),
        PROCESS_TIMEOUT,
        lambda: f"the worker to tell the handler\n{workers.logs()}",
    )
    gate.touch()
    workers.wait_stage(job_id, "cancelled", PROCESS_TIMEOUT)

    assert read_records(workers.record, "atomic-returns", job_id), "the handler returned"
    assert notes(later_db) == []
