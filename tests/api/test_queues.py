"""Named queues: where a job's queue is stored, which server claims it, and
pausing a queue for every server (docs/how-to/queues.md)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connections, transaction

import later_django as later
from later_django import registry
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest
from later_django.db.sql.enqueue import INSERT
from later_django.queues import paused_queues, served
from later_django.worker.server import Server
from tests.helpers import (
    LaterDb,
    await_until,
    in_thread,
    read_records,
    serve,
    set_later,
)
from tests.jobapp.jobs import Noop, Sleep

QUEUES = {"default": {}, "emails": {}, "reports": {}}
# What worker processes are given: the same declared queues.
QUEUE_SETTINGS = {"LATER_TEST_SETTINGS": json.dumps({"QUEUES": QUEUES})}


@pytest.fixture
def queues(settings: Any) -> None:
    set_later(settings, QUEUES=QUEUES)


def queue_of(later_db: LaterDb, job_id: str) -> object:
    return later_db.scalar("SELECT queue FROM later_job WHERE id = %s", [job_id])


def claim(later_db: LaterDb, queue: str, limit: int = 10) -> list[str]:
    """Claim up to ``limit`` ready jobs of ``queue`` as a server would."""
    dialect = dialect_for(later_db.alias)
    request = ClaimRequest(
        namespace="default", owner="test-owner", limit=limit, lease_ms=30_000, queue=queue
    )
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        return [job.id for job in dialect.hot.claim(c, request)]


# -- enqueue ---------------------------------------------------------------------------
def test_a_job_stores_its_queue_and_the_default_queue_stores_none(later_db, queues):
    emails = later.enqueue(Noop(n=1), queue="emails")
    default = later.enqueue(Noop(n=2), queue="default")
    plain = later.enqueue(Noop(n=3))
    many = later.enqueue_many([Noop(n=4), Noop(n=5)], queue="reports")
    delayed = later.enqueue(Noop(n=6), queue="emails", delay=timedelta(hours=1))
    assert queue_of(later_db, emails) == "emails"
    assert queue_of(later_db, default) == ""
    assert queue_of(later_db, plain) == ""
    assert [queue_of(later_db, job_id) for job_id in many] == ["reports", "reports"]
    assert queue_of(later_db, delayed) == "emails"
    child = later.enqueue(Noop(n=7), after=emails, queue="reports")
    assert queue_of(later_db, child) == "reports"


def test_an_undeclared_queue_is_refused_naming_the_setting_and_writes_nothing(later_db, queues):
    with pytest.raises(ValueError, match=r"queue='emial' is not declared in LATER\['QUEUES'\]"):
        later.enqueue(Noop(n=1), queue="emial")
    with pytest.raises(ValueError, match=r"not declared in LATER\['QUEUES'\]"):
        later.enqueue_many([Noop(n=1), Noop(n=2)], queue="nope")
    with pytest.raises(ValueError, match="not a queue name"):
        later.enqueue(Noop(n=1), queue="no spaces")
    with pytest.raises(TypeError, match="queue must be a str"):
        later.enqueue(Noop(n=1), queue=3)  # type: ignore[arg-type]
    assert later_db.job_count() == 0


@dataclass
class Report:
    n: int = 0


def test_a_types_queue_is_its_jobs_default_and_an_enqueue_overrides_it(later_db, queues):
    @later.job(queue="reports")
    def make_report(ctx: Any, payload: Report) -> None:
        pass

    try:
        assert queue_of(later_db, later.enqueue(Report(1))) == "reports"
        assert queue_of(later_db, later.enqueue(Report(2), queue="emails")) == "emails"
        third = later.enqueue(Report(3), queue="default")
        assert queue_of(later_db, third) == ""
        (bulk,) = later.enqueue_many([Report(4)])
        assert queue_of(later_db, bulk) == "reports"
        # Once a type names a queue, bulk inserts write the column of every
        # row: a job of the default queue writes '' there, never NULL.
        plain = later.enqueue_many([Noop(n=1), Noop(n=2)])
        default = later.enqueue_many([Report(5)], queue="default")
        assert [queue_of(later_db, job_id) for job_id in [*plain, *default]] == ["", "", ""]
        assert set(claim(later_db, "default")) == {third, *plain, *default}
    finally:
        registry.unregister(Report)


def test_a_types_undeclared_queue_is_a_system_check_error(settings, queues):
    @later.job(queue="invoices")
    def make_report(ctx: Any, payload: Report) -> None:
        pass

    try:
        errors = [m for m in run_checks() if m.id == "later.E026"]
        assert len(errors) == 1 and "'invoices'" in errors[0].msg
        set_later(settings, QUEUES={**QUEUES, "invoices": {}})
        assert [m for m in run_checks() if m.id == "later.E026"] == []
    finally:
        registry.unregister(Report)


def test_queues_setting_is_checked(settings):
    set_later(settings, QUEUES={"bad name": {}, "ok": []})
    errors = [m for m in run_checks() if m.id == "later.E025"]
    assert len(errors) == 2


@dataclass
class Keyed:
    key: str

    def partition_key(self) -> str:
        return self.key


def test_a_queue_with_a_topic_is_refused_at_registration():
    with pytest.raises(TypeError, match="queue='emails' and topic='orders'"):

        @later.job(queue="emails", topic="orders")
        def handle(ctx: Any, payload: Keyed) -> None:
            pass

    assert registry.handler_by_name(registry.default_name(Keyed)) is None


def test_queues_option_of_later_worker_is_parsed_and_checked(queues):
    assert served("emails=4,default", 8) == {"emails": 4, "default": 8}
    assert served(None, 3) == {"default": 3, "emails": 3, "reports": 3}
    for spec, message in [
        ("emails=0", "whole number >= 1"),
        ("emails=x", "whole number >= 1"),
        ("nope=2", r"not declared in LATER\['QUEUES'\]"),
        ("emails,emails", "twice"),
        ("emails,,default", "empty item"),
    ]:
        with pytest.raises(ValueError, match=message):
            served(spec, 2)


# -- claims ----------------------------------------------------------------------------
def test_a_claim_of_one_queue_takes_only_its_jobs(later_db, queues):
    default = [later.enqueue(Noop(n=n), priority=n) for n in range(3)]
    emails = [later.enqueue(Noop(n=n), queue="emails", priority=50 + n) for n in range(3)]
    # The highest priority of its own queue first, never a higher one of another's.
    assert claim(later_db, "default", limit=1) == [default[2]]
    assert sorted(claim(later_db, "default")) == sorted(default[:2])
    assert claim(later_db, "emails", limit=1) == [emails[2]]
    assert sorted(claim(later_db, "emails")) == sorted(emails[:2])
    assert claim(later_db, "reports") == []


def test_a_paused_queue_is_claimed_by_no_one_and_counts_no_backlog(later_db, queues):
    later.enqueue(Noop(n=1), queue="emails")
    plain = later.enqueue(Noop(n=2))
    dialect = dialect_for(later_db.alias)
    assert later.pause_queue("emails") is True
    assert later.pause_queue("emails") is False, "already paused: nothing changes"
    assert paused_queues() == {"emails"}
    with connections[later_db.alias].cursor() as cursor:
        assert not dialect.hot.ready_exists(cursor, namespace="default", queue="emails")
        assert dialect.hot.ready_exists(cursor, namespace="default")
        assert dialect.reads.plain_ready(cursor, namespace="default", queue="emails") == 0
        assert dialect.reads.plain_ready(cursor, namespace="default") == 1
    assert claim(later_db, "emails") == []
    assert claim(later_db, "default") == [plain], "other queues run on"
    assert later.resume_queue("emails") is True
    assert later.resume_queue("emails") is False
    assert len(claim(later_db, "emails")) == 1
    with pytest.raises(ValueError, match=r"not declared in LATER\['QUEUES'\]"):
        later.pause_queue("nope")


def test_the_default_queue_pauses_too(later_db, queues):
    later.enqueue(Noop(n=1))
    later.pause_queue("default")
    assert claim(later_db, "default") == []
    later.resume_queue("default")
    assert len(claim(later_db, "default")) == 1


def test_each_queue_is_counted_in_its_own_lane(later_db, queues):
    later.enqueue_many([Noop(n=n) for n in range(3)], queue="emails")
    later.enqueue(Noop(n=9))
    claim(later_db, "emails", limit=1)
    dialect = dialect_for(later_db.alias)
    with connections[later_db.alias].cursor() as cursor:
        lanes = {
            (row.lane, row.stage): row.n
            for row in dialect.reads.lane_counts(cursor, namespace="default")
            if row.n
        }
    assert lanes == {("q:emails", "enqueued"): 2, ("q:emails", "running"): 1, ("", "enqueued"): 1}
    assert later.stage_counts()["enqueued"] == 3


def test_a_server_of_one_queue_runs_only_that_queues_jobs(later_db, queues, record):
    other = later.enqueue(Noop(n=1))
    mine = [later.enqueue(Noop(n=n), queue="emails") for n in range(5)]

    async def body(server: Server) -> None:
        assert server.served_queues == "emails"
        await await_until(
            lambda: in_thread(lambda: all(later_db.stage_of(j) == "success" for j in mine)),
            10,
            "the emails jobs succeed",
        )
        assert await in_thread(later_db.stage_of, other) == "enqueued"

    serve(body, queues={"emails": 2})
    served_row = later_db.rows("SELECT queues FROM later_server")
    assert served_row == [], "the server deregistered"


def test_a_resumed_queue_wakes_an_idle_server_without_its_poll(later_db, queues, settings, record):
    """Resuming a queue wakes the idle workers serving it at once: PostgreSQL
    by NOTIFY, SQLite by the watch of the commit counter."""
    set_later(settings, POLL_INTERVAL=timedelta(seconds=60))
    later.pause_queue("emails")
    job_id = later.enqueue(Noop(n=1), queue="emails")

    async def body(server: Server) -> None:
        async def idle() -> bool:
            return server.queues[0].pool.slots[0].idle

        await await_until(idle, 10, "the worker waits for work")
        await in_thread(later.resume_queue, "emails")
        await await_until(
            lambda: in_thread(lambda: later_db.stage_of(job_id) == "success"),
            10,
            "the job of the resumed queue runs well before the 60 s poll",
        )

    serve(body, queues={"emails": 1})


# -- later_worker processes ------------------------------------------------------------
def overlaps(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = open_now = 0
    for _, change in events:
        open_now += change
        most = max(most, open_now)
    return most


def test_two_queues_served_by_two_processes_run_only_where_served(later_db, queues, workers):
    """``--queues``: each queue's jobs run only in the process serving it,
    never more at once than its workers."""
    emails_proc = workers.start("--queues", "emails=2", workers=None, env=QUEUE_SETTINGS)
    default_proc = workers.start("--queues", "default=3", workers=None, env=QUEUE_SETTINGS)
    workers.wait_registered(emails_proc, default_proc)
    served_by = dict(later_db.rows("SELECT pid, queues FROM later_server"))
    assert served_by == {emails_proc.pid: "emails", default_proc.pid: "default"}
    emails = [later.enqueue(Sleep(seconds=0.1, n=n), queue="emails") for n in range(12)]
    plain = [later.enqueue(Sleep(seconds=0.1, n=n)) for n in range(12)]
    for job_id in emails + plain:
        workers.wait_stage(job_id, "success", 60)
    starts = {r.job_id: r for r in read_records(workers.record, "sleep-start")}
    ends = {r.job_id: r for r in read_records(workers.record, "sleep-end")}
    assert {starts[j].pid for j in emails} == {emails_proc.pid}
    assert {starts[j].pid for j in plain} == {default_proc.pid}
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job_id in emails + plain:
        spans["emails" if job_id in emails else "default"].append(
            (starts[job_id].start, ends[job_id].start)
        )
    assert overlaps(spans["emails"]) <= 2
    assert overlaps(spans["default"]) <= 3
    assert overlaps(spans["emails"]) == 2, "both workers of the queue were used"


PAUSE_WINDOW = 10.0  # seconds a paused queue must start nothing (issue acceptance)


def test_a_paused_queue_starts_nothing_through_a_restart_and_resume_drains_it(
    later_db, queues, workers
):
    proc = workers.start("--queues", "emails=2,default=2", workers=None, env=QUEUE_SETTINGS)
    workers.wait_registered(proc)
    assert later.pause_queue("emails") is True
    paused_at = time.time()
    emails = [later.enqueue(Noop(n=n), queue="emails") for n in range(5)]
    deadline = time.monotonic() + PAUSE_WINDOW
    restarted = False
    while time.monotonic() < deadline:
        # The other queue runs meanwhile; half way through, the process restarts.
        workers.wait_stage(later.enqueue(Noop(n=100)), "success", 30)
        if not restarted and time.monotonic() > deadline - PAUSE_WINDOW / 2:
            assert proc.stop() == 0, proc.output()
            proc = workers.start("--queues", "emails=2,default=2", workers=None, env=QUEUE_SETTINGS)
            workers.wait_registered(proc)
            restarted = True
    assert restarted
    assert {later_db.stage_of(job_id) for job_id in emails} == {"enqueued"}
    started = later_db.scalar(
        "SELECT COUNT(*) FROM later_job WHERE queue = 'emails' AND started_ms IS NOT NULL"
    )
    assert started == 0, f"nothing of the paused queue started since {paused_at}"
    assert later.resume_queue("emails") is True
    for job_id in emails:
        workers.wait_stage(job_id, "success", 30)


def test_a_task_of_a_named_queue_runs_only_on_a_worker_serving_it(
    later_db, queues, workers, settings
):
    from tests.jobapp import tasks

    settings.TASKS = {
        "default": {
            "BACKEND": "later_django.tasks.LaterBackend",
            "QUEUES": ["default", "emails"],
        }
    }
    emails_proc = workers.start("--queues", "emails=1", workers=None, env=QUEUE_SETTINGS)
    default_proc = workers.start("--queues", "default=1", workers=None, env=QUEUE_SETTINGS)
    workers.wait_registered(emails_proc, default_proc)
    results = [tasks.record_run.using(queue_name="emails").enqueue(f"e{n}") for n in range(4)]
    results += [tasks.record_run.enqueue(f"d{n}") for n in range(4)]
    for result in results:
        workers.wait_stage(result.id, "success", 30)
    assert [queue_of(later_db, r.id) for r in results] == ["emails"] * 4 + [""] * 4
    lines = [line.split() for line in workers.record.read_text().splitlines()]
    ran_in = {tag: int(pid) for kind, tag, pid, _ in lines if kind == "task"}
    assert {ran_in[f"e{n}"] for n in range(4)} == {emails_proc.pid}
    assert {ran_in[f"d{n}"] for n in range(4)} == {default_proc.pid}


def test_drain_runs_every_declared_queue_but_a_paused_one(later_db, queues, record):
    from later_django.testing import drain

    default = later.enqueue(Noop(n=1))
    emails = later.enqueue(Noop(n=2), queue="emails")
    reports = later.enqueue(Noop(n=3), queue="reports")
    later.pause_queue("reports")
    assert {run.job_id for run in drain()} == {default, emails}
    assert later_db.stage_of(reports) == "enqueued", "a paused queue waits in drain() too"
    later.resume_queue("reports")
    assert [run.job_id for run in drain()] == [reports]


def test_a_claim_of_any_queue_reads_its_run_of_the_ready_index_without_sorting(later_db, queues):
    """Each queue's ready jobs are a run of the ready index in claim order:
    a claim of one queue reads its run from the start, whatever another
    queue's backlog (a plain claim must not pay for named queues)."""
    later.enqueue_many([Noop(n=n) for n in range(2000)])
    later.enqueue_many([Noop(n=n) for n in range(2000)], queue="emails")
    dialect = dialect_for(later_db.alias)
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute("ANALYZE")
    sqlite = later_db.vendor == "sqlite"
    for queue in ("default", "emails"):
        request = ClaimRequest(
            namespace="default", owner="o", limit=8, lease_ms=30_000, queue=queue
        )
        sql, params = dialect.hot._claim_statement(request)
        with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
            c.execute(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + sql, params)
            plan = "\n".join(str(row[-1]) if sqlite else row[0] for row in c.fetchall())
        assert "later_job_ready" in plan, plan
        assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan


# The claim of the release before queues, frozen: it names no queue.
PREVIOUS_RELEASE_CLAIM = """
UPDATE later_job SET stage = 'running', attempts = attempts + 1,
    changed_ms = {greatest}({now}, changed_ms), started_ms = {greatest}({now}, changed_ms),
    lease_owner = %s, lease_expires_ms = {now} + %s,
    history = history || 'running@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage = 'enqueued' AND topic IS NULL
    ORDER BY priority DESC, id
    LIMIT %s)
RETURNING id
"""


def test_during_a_rolling_upgrade_both_releases_share_the_migrated_tables(later_db, queues):
    """Servers of the previous release run beside this one while a deploy
    rolls (docs/how-to/queues.md, "Upgrading"): their plain inserts name no queue
    column and land in the default queue, which this release claims; their
    claims still work on the migrated tables, and take any queue's jobs,
    paused or not, as documented; the counters stay exact either way."""
    columns = INSERT.text.split("(", 1)[1].split(")", 1)[0].replace("\n", " ").split(", ")
    columns = [column.strip() for column in columns]
    assert "queue" not in columns, "a plain insert is the previous release's insert"
    plain = later.enqueue(Noop(n=1))
    emails = later.enqueue(Noop(n=2), queue="emails", priority=5)
    later.pause_queue("emails")
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        c.execute(dialect.hot._sql(PREVIOUS_RELEASE_CLAIM), ["old", 30_000, "default", 10])
        taken = [row[0] for row in c.fetchall()]
    assert sorted(taken) == sorted([plain, emails])
    counts = {stage: n for stage, n in later.stage_counts().items() if n}
    assert counts == {"running": 2}
    with connections[later_db.alias].cursor() as cursor:
        lanes = {
            (row.lane, row.stage): row.n
            for row in dialect.reads.lane_counts(cursor, namespace="default")
            if row.n
        }
    assert lanes == {("", "running"): 1, ("q:emails", "running"): 1}


def test_later_worker_refuses_an_undeclared_queue_before_it_starts(later_db, queues):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=r"--queues='nope' is not declared in LATER\['QUEUES'\]"):
        call_command("later_worker", queues="emails,nope")
    assert later_db.rows("SELECT id FROM later_server") == [], "no server started"


def test_a_pause_inside_a_transaction_that_rolls_back_never_happened(later_db, queues):
    """pause_queue joins the caller's transaction: rolled back with it, the
    queue was never paused and its jobs are claimed as before."""

    class Undo(Exception):
        pass

    later.enqueue(Noop(n=1), queue="emails")
    with pytest.raises(Undo), transaction.atomic(using=later_db.alias):
        assert later.pause_queue("emails") is True
        assert paused_queues() == {"emails"}, "paused inside the transaction"
        raise Undo
    assert paused_queues() == set()
    assert len(claim(later_db, "emails")) == 1
