"""Per-key concurrency across every server (docs/how-to/concurrency-limits.md): the
@job options and the keys an enqueue stores, the claim that keeps each
key's limit exact under concurrent claimers, every way a running job frees
its key's slot, a server whose ready jobs are all over their limits (no
busy loop, no backlog for autoscale), the metric, and three worker
processes that never run two jobs of one key at once."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from django.db import connections, transaction

import later_django as later
from later_django import registry
from later_django.db import dialect_for
from later_django.db.enqueue import option_columns
from later_django.db.rows import (
    ClaimRequest,
    ExpiredFence,
    FailureWrite,
    LimitedClaim,
    LimitedClaimRequest,
    OwnerFence,
    RetryWrite,
    SuccessBatch,
)
from later_django.db.sql.enqueue import INSERT
from later_django.limits import QueueLimits
from later_django.metrics import read_limited_jobs
from later_django.worker.server import Server
from tests.helpers import LaterDb, await_until, in_thread, read_records, serve, set_later
from tests.jobapp.jobs import Noop

KEYED = QueueLimits(keyed=True)
OWNER = "server-a"


@pytest.fixture
def limited() -> Iterator[ModuleType]:
    """The job types with concurrency limits (tests/jobapp/limited_jobs.py),
    registered for this test only."""
    module = importlib.import_module("tests.jobapp.limited_jobs")
    module.register()
    try:
        yield module
    finally:
        module.unregister()


def claim_keyed(later_db: LaterDb, limit: int = 10, owner: str = OWNER) -> list[str]:
    """One keyed claim of the default queue, as a server's claimer makes it."""
    request = LimitedClaimRequest(
        claim=ClaimRequest(namespace="default", owner=owner, limit=limit, lease_ms=30_000),
        limits=KEYED,
    )
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        claimed: LimitedClaim = dialect.limits.claim_limited(c, request)
    return [job.id for job in claimed.jobs]


def key_columns(later_db: LaterDb, job_id: str) -> tuple[object, ...]:
    return later_db.rows(
        "SELECT concurrency_key, concurrency_limit FROM later_job WHERE id = %s", [job_id]
    )[0]


# -- the options ------------------------------------------------------------------------
@dataclass
class Import:
    customer: int
    key: Any = None


@dataclass
class Topical:
    n: int = 0

    def partition_key(self) -> str:
        return str(self.n)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"concurrency_key": "customer"}, TypeError, "concurrency_key must be a callable"),
        ({"concurrency": 0}, ValueError, "concurrency=0 is out of range; use 1.."),
        ({"concurrency": True}, TypeError, "concurrency must be an int, got bool"),
        ({"concurrency": "2"}, TypeError, "concurrency must be an int, got str"),
        (
            {"concurrency": 1, "topic": "orders"},
            TypeError,
            "concurrency limits do not apply to topic='orders'",
        ),
    ],
)
def test_bad_concurrency_options_are_refused_at_registration(options, error, message):
    def handler(ctx: Any, payload: Topical) -> None:
        pass

    with pytest.raises(error, match=f"@job\\(...\\) of .*handler: {message}"):
        later.job(**options)(handler)
    with pytest.raises(later.NotRegistered):
        registry.handler_for_payload(Topical())


def test_a_key_without_a_concurrency_means_one_and_a_concurrency_alone_keys_the_type():
    def by_customer(payload: Import) -> str:
        return f"customer-{payload.customer}"

    def handler(ctx: Any, payload: Import) -> None:
        pass

    later.job(concurrency_key=by_customer)(handler)
    try:
        assert registry.handler_for_payload(Import(1)).concurrency == 1
        later.job(concurrency=3)(handler)
        found = registry.handler_for_payload(Import(1))
        assert (found.concurrency_key, found.concurrency) == (None, 3)
    finally:
        registry.unregister(Import)


def test_an_enqueue_stores_the_key_and_the_limit_and_plain_jobs_store_neither(later_db, limited):
    keyed = later.enqueue(limited.Keyed(key="customer-7"))
    pair = later.enqueue(limited.Pair(key="x"))
    whole = later.enqueue(limited.Exclusive())
    many = later.enqueue_many([limited.Keyed(key="a"), limited.Keyed(key="b"), Noop(n=1)])
    child = later.enqueue(limited.Keyed(key="c"), after=keyed)
    delayed = later.enqueue(limited.Keyed(key="d"), delay=timedelta(hours=1))
    plain = later.enqueue(Noop(n=2))
    assert key_columns(later_db, keyed) == ("customer-7", 1)
    assert key_columns(later_db, pair) == ("pair-x", 2)
    assert key_columns(later_db, whole) == (
        registry.handler_for_payload(limited.Exclusive()).name,
        1,
    )
    assert [key_columns(later_db, job_id) for job_id in many] == [("a", 1), ("b", 1), (None, None)]
    assert key_columns(later_db, child) == ("c", 1)
    assert key_columns(later_db, delayed) == ("d", 1)
    assert key_columns(later_db, plain) == (None, None)


def test_the_job_page_shows_a_keyed_jobs_key_and_limit(later_db, limited):
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="later_django", codename="view_dashboard")
    )
    client = Client()
    client.force_login(user)
    pair = later.enqueue(limited.Pair(key="x"))
    plain = later.enqueue(Noop(n=1))
    page = client.get(f"/admin/later/jobs/{pair}/").content.decode()
    assert re.search(r'id="later-concurrency-key">pair-x \(at most 2 running at once\)<', page)
    assert "later-concurrency-key" not in client.get(f"/admin/later/jobs/{plain}/").content.decode()
    detail = client.get(f"/admin/later/api/jobs/{pair}").json()
    assert (detail["concurrency_key"], detail["concurrency_limit"]) == ("pair-x", 2)


def test_a_plain_jobs_insert_names_no_limit_column(limited):
    """Plain jobs pay nothing: their insert is the one before limits existed."""
    from later_django.builder import JobBuilder
    from later_django.db.enqueue import insert_statement
    from later_django.options import PLAIN

    plain = JobBuilder().build(Noop(n=1), PLAIN)
    assert insert_statement(plain)[0] is INSERT
    assert option_columns(plain) == ((), {})
    keyed = JobBuilder().build(limited.Keyed(key="k"), PLAIN)
    assert option_columns(keyed) == (
        ("concurrency_key", "concurrency_limit"),
        {"concurrency_key": "k", "concurrency_limit": 1},
    )


def test_a_bad_key_is_refused_at_enqueue_and_writes_nothing(later_db):
    def handler(ctx: Any, payload: Import) -> None:
        pass

    later.job(concurrency_key=lambda payload: payload.key)(handler)
    try:
        with pytest.raises(TypeError, match=r"concurrency_key of .*Import returned int; it must"):
            later.enqueue(Import(1, key=42))
        with pytest.raises(ValueError, match="returned a key of 256 characters; keep keys to 255"):
            later.enqueue(Import(1, key="x" * 256))
        with pytest.raises(TypeError, match=r"payloads\[1\]: concurrency_key .* returned NoneType"):
            later.enqueue_many([Import(1, key="ok"), Import(2, key=None)])
        assert later_db.job_count() == 0
    finally:
        registry.unregister(Import)


def test_a_keyed_job_on_a_queue_whose_claims_keep_no_keys_is_refused(later_db, limited, settings):
    set_later(settings, QUEUES={"default": {}, "emails": {}})
    with pytest.raises(ValueError, match=r"queue='emails': jobs of .*Keyed have a concurrency"):
        later.enqueue(limited.Keyed(key="k"), queue="emails")
    assert later_db.job_count() == 0


def test_a_server_claims_with_the_keyed_claim_only_where_a_keyed_type_runs(settings, limited):
    set_later(settings, QUEUES={"default": {}, "emails": {}})
    server = Server(queues={"default": 1, "emails": 1})
    default, emails = (queue.claimer for queue in server.queues)
    assert default.limits == KEYED
    assert emails.limits is None and emails._claims._flush == emails._claim_batch
    assert [queue.pool.wake_when_stored for queue in server.queues] == [True, False]


def test_without_keyed_types_every_queue_claims_plainly():
    server = Server(workers=1)
    assert [queue.claimer.limits for queue in server.queues] == [None]


# -- the claim ----------------------------------------------------------------------------
def test_concurrent_keyed_claims_run_no_more_of_a_key_than_its_limit(later_db):
    """Claims of many servers at once: each key's limit holds whichever claim
    comes first (PostgreSQL: the advisory lock; SQLite: its one writer)."""
    from tests.conformance.helpers import insert

    for key, limit in (("one", 1), ("two", 2), ("three", 3)):
        for _ in range(8):
            insert(later_db, concurrency_key=key, concurrency_limit=limit)
    start = threading.Barrier(6)

    def one_claim(n: int) -> list[str]:
        try:
            start.wait()
            return claim_keyed(later_db, limit=4, owner=f"server-{n}")
        finally:
            connections.close_all()

    with ThreadPoolExecutor(6) as pool:
        taken = [job for claimed in pool.map(one_claim, range(6)) for job in claimed]
    running = dict(
        later_db.rows(
            "SELECT concurrency_key, COUNT(*) FROM later_job WHERE stage = 'running' "
            "GROUP BY concurrency_key"
        )
    )
    assert running == {"one": 1, "two": 2, "three": 3}
    assert len(taken) == 6


def _release(how: str) -> Callable[[Any, Any, str, int], bool]:
    """How a running job of the key frees its slot, as the worker, the
    rescuer or cancel() stores it."""

    def release(dialect: Any, cursor: Any, job_id: str, attempts: int) -> bool:
        fence = OwnerFence(job_id=job_id, attempts=attempts, owner=OWNER)
        if how == "success":
            done = dialect.hot.complete_many(
                cursor, SuccessBatch(owner=OWNER, jobs=[(job_id, attempts)], retention_ms=60_000)
            )
            return done.done_ids == [job_id]
        if how == "failure":
            return dialect.hot.fail(cursor, fence, FailureWrite(error="x", retention_ms=1))
        if how == "retry":
            return dialect.hot.retry(cursor, fence, RetryWrite(delay_ms=3_600_000, error="x"))
        if how == "cancel":
            dialect.control.cancel(cursor, namespace="default", job_id=job_id, retention_ms=1)
            return dialect.hot.cancel_running(cursor, fence, 60_000)
        if how == "unclaim":
            return dialect.hot.unclaim(cursor, fence)
        if how == "snooze":
            return dialect.hot.snooze(cursor, fence, 3_600_000)
        assert how == "lease rescue"
        cursor.execute("UPDATE later_job SET lease_expires_ms = 0 WHERE id = %s", [job_id])
        expired = ExpiredFence(job_id=job_id, attempts=attempts, expired_for_ms=1_000)
        return dialect.hot.retry(cursor, expired, RetryWrite(delay_ms=3_600_000, error="x"))

    return release


@pytest.mark.parametrize(
    "how", ["success", "failure", "retry", "cancel", "lease rescue", "unclaim", "snooze"]
)
def test_every_way_a_job_stops_running_frees_its_keys_slot(later_db, how):
    from tests.conformance.helpers import insert

    first, second = (insert(later_db, concurrency_key="k", concurrency_limit=1) for _ in range(2))
    assert claim_keyed(later_db) == [first]
    assert claim_keyed(later_db) == [], "the key is at its limit"
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        assert _release(how)(dialect, c, first, 1)
    taken = claim_keyed(later_db)
    # An unclaimed job is ready again, first in claim order: it takes the slot.
    assert taken == ([first] if how == "unclaim" else [second])


# -- a server ----------------------------------------------------------------------------
def spans(record: Any, kind: str) -> dict[str, list[tuple[float, float]]]:
    """Each key's handler runs as (start, end), from the records."""
    starts = {(r.job_id, r.attempt): r for r in read_records(record, f"{kind}-start")}
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for end in read_records(record, f"{kind}-end"):
        start = starts[end.job_id, end.attempt]
        by_key[end.tag].append((start.start, end.start))
    return by_key


def overlaps(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = open_now = 0
    for _, change in events:
        open_now += change
        most = max(most, open_now)
    return most


def test_jobs_over_their_limit_wait_without_holding_a_worker(later_db, limited, record):
    """Two workers, a key with a queue of slow jobs: one worker runs them one
    at a time, the other runs every other key's jobs meanwhile."""
    slow = [later.enqueue(limited.Keyed(key="slow", seconds=0.3, n=n)) for n in range(4)]
    others = [later.enqueue(limited.Keyed(key=f"k{n}", seconds=0.05)) for n in range(6)]
    pairs = [later.enqueue(limited.Pair(key="p", seconds=0.2)) for _ in range(4)]

    async def body(server: Server) -> None:
        await await_until(
            lambda: in_thread(lambda: all(later_db.stage_of(j) == "success" for j in others)),
            10,
            "the other keys' jobs ran",
        )
        stages = await in_thread(lambda: [later_db.stage_of(j) for j in slow])
        assert stages.count("success") <= 2, "they did not wait behind the slow key"
        await await_until(
            lambda: in_thread(lambda: all(later_db.stage_of(j) == "success" for j in slow + pairs)),
            15,
            "every job ran",
        )

    serve(body, workers=3)
    runs = spans(record, "keyed")
    assert overlaps(runs["slow"]) == 1
    assert overlaps(spans(record, "pair")["p"]) == 2, "two of a key whose limit is two"


def test_a_freed_key_wakes_a_worker_without_its_poll(later_db, limited, settings, record):
    """PostgreSQL announces no finished job: the server that stored the
    outcome wakes a worker of the queue itself."""
    set_later(settings, POLL_INTERVAL=timedelta(seconds=60))
    first = later.enqueue(limited.Keyed(key="k", seconds=0.2, n=1))
    second = later.enqueue(limited.Keyed(key="k", n=2))

    async def body(server: Server) -> None:
        await await_until(
            lambda: in_thread(lambda: later_db.stage_of(second) == "success"),
            10,
            "the second job of the key runs well before the 60 s poll",
        )

    serve(body, workers=2)
    assert later_db.stage_of(first) == "success"


def test_a_queue_whose_ready_jobs_are_all_over_their_limits_does_not_claim_in_a_loop(
    later_db, limited, record
):
    """One key at its limit with jobs waiting: the idle workers claim about
    once a poll (every 50 ms here), not in a loop, and autoscale reads no
    backlog while they wait."""
    later.enqueue(limited.Exclusive(seconds=1.5))
    waiting = [later.enqueue(limited.Exclusive()) for _ in range(30)]
    claims: list[LimitedClaim] = []

    def count_claims(server: Server) -> None:
        sessions = server.queues[0].claimer.sessions
        claim = sessions.claim_limited

        async def counted(request: LimitedClaimRequest) -> LimitedClaim:
            claimed = await claim(request)
            claims.append(claimed)
            return claimed

        sessions.claim_limited = counted  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        queue = server.queues[0]

        async def held_back() -> bool:
            return any(slot.idle for slot in queue.pool.slots) and len(claims) > 0

        await await_until(held_back, 10, "a worker waits while the key is at its limit")
        assert await queue.ready_backlog() == 0, "no backlog for autoscale"
        assert await in_thread(read_limited_jobs) == {"default": 30}
        before = len(claims)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(0.5)
        per_second = (len(claims) - before) / (loop.time() - started)
        assert per_second < 60, f"{per_second:.0f} claims a second: a loop"
        await await_until(
            lambda: in_thread(lambda: all(later_db.stage_of(j) == "success" for j in waiting)),
            20,
            "every job of the key ran, one at a time",
        )

    serve(body, workers=3, before_start=count_claims)
    assert overlaps(spans(record, "exclusive")[""]) == 1


def test_a_sync_handler_past_its_timeout_keeps_its_keys_slot_until_its_thread_ends(
    later_db, limited, record
):
    """A keyed sync job whose handler runs past its timeout: its one worker
    moves on (another key's job runs meanwhile), but the job stays running,
    its key's slot taken, until the handler's thread returns; then its
    JobTimeout is stored and the retry policy goes on. No two runs of the
    key overlap, the abandoned ones included."""
    slow = later.enqueue(limited.Keyed(key="k", seconds=0.5), timeout=timedelta(milliseconds=150))
    after = later.enqueue(limited.Keyed(key="k"))
    other = later.enqueue(limited.Keyed(key="other"))

    async def body(server: Server) -> None:
        await await_until(
            lambda: in_thread(
                lambda: (
                    later_db.stage_of(slow) == "failed" and later_db.stage_of(after) == "success"
                )
            ),
            30,
            "the slow job's four attempts and the other job of its key ran",
        )

    serve(body, workers=1)
    runs = spans(record, "keyed")
    assert len(runs["k"]) == 5, "four attempts of the slow job, one of the other"
    assert overlaps(runs["k"]) == 1
    first_end = next(r for r in read_records(record, "keyed-end", slow) if r.attempt == 1)
    other_start = read_records(record, "keyed-start", other)[0]
    assert other_start.start < first_end.start, "the worker did not wait for the thread"
    info = later.get_job(slow)
    assert info.attempts == 4
    assert info.last_error.startswith("JobTimeout: the attempt ran past the job's timeout")


def test_shutdown_waits_for_a_keyed_job_past_its_timeout_as_for_a_running_one(
    later_db, limited, record, caplog
):
    """A keyed job past its timeout whose handler still runs counts as
    running at shutdown: the server waits for its thread (up to the
    shutdown timeout), then stores its JobTimeout before it stops."""
    job_id = later.enqueue(limited.Keyed(key="k", seconds=0.6), timeout=timedelta(milliseconds=100))

    async def held() -> bool:
        return any(getattr(r, "action", None) == "key_held" for r in caplog.records)

    async def main() -> None:
        server = Server(workers=1)
        await server.start()
        try:
            await await_until(held, 10, "the job's outcome held past its timeout")
            assert read_records(record, "keyed-end", job_id) == []
        finally:
            await server.shutdown(5)

    with caplog.at_level(logging.WARNING, logger="later_django"):
        asyncio.run(main())
    assert len(read_records(record, "keyed-end", job_id)) == 1
    info = later.get_job(job_id)
    assert info.stage == "requeued"
    assert info.last_error.startswith("JobTimeout: the attempt ran past the job's timeout")


# -- across processes (the acceptance) -----------------------------------------
KEYS = 40
JOBS_PER_KEY = 6


def test_three_processes_never_run_two_jobs_of_one_key_at_once(later_db, limited, workers):
    """``concurrency=1`` per key, three later_worker processes of eight
    workers each, forty keys: no two runs of one key overlap, by the start
    and end times the handlers record, retries included."""
    env = {"LATER_TEST_SETTINGS": json.dumps({"JOBS_MODULE": "limited_jobs"})}
    procs = [workers.start(workers=8, env=env) for _ in range(3)]
    workers.wait_registered(*procs)
    payloads = [
        limited.Keyed(key=f"key-{k}", seconds=0.02 * (1 + (n + k) % 4), n=n, fail_until=n % 3)
        for n in range(JOBS_PER_KEY)
        for k in range(KEYS)
    ]
    jobs = later.enqueue_many(payloads)
    for job_id in jobs:
        workers.wait_stage(job_id, "success", 90)
    runs = spans(workers.record, "keyed")
    assert sorted(runs) == sorted(f"key-{k}" for k in range(KEYS))
    assert {key: overlaps(found) for key, found in runs.items() if overlaps(found) > 1} == {}
    every = [span for found in runs.values() for span in found]
    assert overlaps(every) >= 8, "many keys ran at once"
    pids = {r.pid for r in read_records(workers.record, "keyed-start")}
    assert pids == {p.pid for p in procs}, "every process ran jobs"
    # Retries were among them: a run of a later attempt of the same key.
    assert len(every) > len(jobs)


def test_a_keyed_recurring_schedule_stores_its_occurrences_key(later_db, limited):
    later.enqueue_recurring("nightly", limited.Keyed(key="nightly"), "* * * * * *")
    dialect = dialect_for(later_db.alias)
    from later_django.recurring.firing import fire_schedules

    with connections[later_db.alias].cursor() as cursor:
        fired = fire_schedules(
            dialect,
            cursor,
            alias=later_db.alias,
            ahead_ms=2_000,
            grace_ms=60_000,
            namespace="default",
        )
    assert fired >= 1
    keys = later_db.rows("SELECT DISTINCT concurrency_key, concurrency_limit FROM later_job")
    assert keys == [("nightly", 1)]


def test_the_queues_panel_marks_a_queue_whose_claims_keep_keys(later_db, limited, admin_client):
    data = json.loads(admin_client.get("/admin/later/api/queues").content)
    assert {row["name"]: row["keyed"] for row in data["queues"]} == {"default": True}
    page = admin_client.get("/admin/later/queues/").content.decode()
    assert ">concurrency keys</span>" in page
