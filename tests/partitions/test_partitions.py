"""Sequential partition mode in one process: enqueue, sequences, the lane
rule and in-order runs (docs/how-to/partitions.md). Real processes, kills and
pauses are in tests/partitions/test_partition_processes.py."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connections, transaction

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest
from later_django.exceptions import UnknownTopic
from later_django.partitions.hashing import partition_for_key
from tests.conformance.helpers import claim, complete
from tests.helpers import LaterDb, await_until, in_thread, read_records, serve, set_later
from tests.jobapp.jobs import Noop, Ordered, OrderedSync, SlowTick
from tests.order_check import checked_pairs, order_violations, ordered_runs, stored_runs

TOPICS = {"ordered": 8}


@pytest.fixture
def topics(later_db: LaterDb, settings: object) -> LaterDb:
    set_later(settings, TOPICS=TOPICS)
    return later_db


def final_attempts(later_db: LaterDb) -> dict[str, int]:
    """Each succeeded job's final attempt."""
    rows = later_db.rows("SELECT id, attempts FROM later_job WHERE stage = 'success'")
    return {str(job_id): int(attempts) for job_id, attempts in rows}  # type: ignore[call-overload]


# -- enqueue ----------------------------------------------------------------------
def test_partition_for_key_is_exported_and_stable():
    assert later.partition_for_key("customer-42", 8) == partition_for_key("customer-42", 8)


def test_plain_enqueue_of_a_topic_type_is_refused_and_writes_nothing(topics):
    with pytest.raises(TypeError, match="enqueue_to_partition"):
        later.enqueue(Ordered("a", 1))
    with pytest.raises(TypeError, match="enqueue_to_partition"):
        later.enqueue_many([Ordered("a", 1)])
    assert topics.rows("SELECT id FROM later_job") == []


def test_a_type_without_topic_is_refused_by_enqueue_to_partition(topics):
    with pytest.raises(TypeError, match="has no topic"):
        later.enqueue_to_partition(Noop())
    assert topics.rows("SELECT id FROM later_job") == []


def test_an_unregistered_topic_is_refused_and_writes_nothing(later_db, settings):
    set_later(settings, TOPICS={"other": 2})
    with pytest.raises(UnknownTopic, match="LATER\\['TOPICS'\\]"):
        later.enqueue_to_partition(Ordered("a", 1))
    assert later_db.rows("SELECT id FROM later_job") == []
    assert later_db.rows("SELECT * FROM later_partition_seq") == []


def test_sequences_are_gapless_per_partition_and_a_rollback_leaves_no_gap(topics):
    alias = topics.alias
    first = later.enqueue_to_partition(Ordered("k", 0))
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        later.enqueue_to_partition_in(Ordered("k", 1))
        raise RuntimeError("roll back")
    second = later.enqueue_to_partition(Ordered("k", 2))
    other = later.enqueue_to_partition(Ordered("other-key", 0))
    a, b, c = (later.get_job(i) for i in (first, second, other))
    assert (a.topic, a.partition, a.sequence) == ("ordered", partition_for_key("k", 8), 0)
    assert b.sequence == 1  # the rolled-back enqueue left no gap
    assert c.partition == partition_for_key("other-key", 8)
    if c.partition != a.partition:
        assert c.sequence == 0


def test_enqueue_to_partition_in_needs_a_transaction(topics):
    with pytest.raises(later.TransactionRequired):
        later.enqueue_to_partition_in(Ordered("k", 0))


def test_a_continuation_to_an_unknown_parent_writes_nothing_and_takes_no_sequence(topics):
    with transaction.atomic(using=topics.alias):
        with pytest.raises(later.JobNotFound):
            later.enqueue_continue_to_partition("0" * 26, Ordered("k", 0))
        job_id = later.enqueue_to_partition(Ordered("k", 1))
    assert later.get_job(job_id).sequence == 0
    assert len(topics.rows("SELECT id FROM later_job")) == 1


def _finish_elsewhere(later_db: LaterDb, parent: str, outcome: str) -> None:
    """Finish ``parent`` on another connection (the worker's own completion,
    or a cancel), which cannot see a child that is not committed yet."""
    if outcome == "cancelled":
        assert later.cancel(parent)
    else:
        [job] = claim(later_db)
        assert complete(later_db, [(parent, job.attempts)]).done_ids == [parent]


@pytest.mark.parametrize(
    ("outcome", "child_stage"), [("success", "enqueued"), ("cancelled", "failed")]
)
def test_a_partition_continuation_whose_parent_finished_before_its_commit_is_settled(
    topics, outcome, child_stage
):
    """The parent finishes while the continuation's transaction is open, so
    it cannot release or fail the child; the commit settles it, as it does a
    plain continuation, instead of leaving it at its partition's head."""
    parent = later.enqueue(Noop())
    dialect = dialect_for(topics.alias)
    with ThreadPoolExecutor(1) as pool:
        with transaction.atomic(using=topics.alias):
            child = later.enqueue_continue_to_partition(parent, Ordered("k", 0))
            finished = pool.submit(_finish_elsewhere, topics, parent, outcome)
            if not dialect.single_writer:  # else it waits for this commit
                finished.result(timeout=10)
        finished.result(timeout=10)
    assert topics.stage_of(child) == child_stage


# -- the lane rule: plain workers never see partition jobs -------------------------
def two_keys() -> tuple[str, str]:
    """Two keys of ``ordered`` that hash to different partitions."""
    other = next(
        key for key in (f"key-{n}" for n in range(100))
        if partition_for_key(key, 8) != partition_for_key("k", 8)
    )  # fmt: skip
    return "k", other


def test_partition_stats_reports_every_partition_of_a_registered_topic(topics):
    """Every partition of a registered topic is reported, in order, also
    those that never had a job: depth 0, no head, no lease."""
    call_command("later_migrate", verbosity=0)
    first, second = two_keys()
    for n in range(3):
        later.enqueue_to_partition(Ordered(first, n))
    later.enqueue_to_partition(Ordered(second, 0))
    stats = [s for s in later.partition_stats() if s.topic == "ordered"]
    assert [s.partition for s in stats] == list(range(8))
    used = {partition_for_key(first, 8): 3, partition_for_key(second, 8): 1}
    assert {s.partition: s.depth for s in stats} == {p: used.get(p, 0) for p in range(8)}
    for s in stats:
        if s.partition in used:
            assert (s.head_sequence, s.head_stage) == (0, "enqueued")
        else:
            assert (s.next_sequence, s.head_sequence, s.head_stage, s.head_run_at_ms) == (
                0, None, None, None,
            )  # fmt: skip
            assert (s.owner, s.epoch, s.lease_expires_ms) == (None, 0, 0)


def test_plain_claims_counts_and_ready_checks_skip_partition_jobs(topics):
    later.enqueue_to_partition(Ordered("k", 0))
    dialect = dialect_for(topics.alias)
    with connections[topics.alias].cursor() as c:
        assert dialect.hot.ready_exists(c, namespace="default") is False
        assert dialect.reads.plain_ready(c, namespace="default") == 0
        assert dialect.reads.stage_counts(c, namespace="default")["enqueued"] == 1

    with transaction.atomic(using=topics.alias), connections[topics.alias].cursor() as c:
        claimed = dialect.hot.claim(
            c, ClaimRequest(namespace="default", owner="plain", limit=10, lease_ms=30_000)
        )
    assert claimed == []
    plain = later.enqueue(Noop())
    with connections[topics.alias].cursor() as c:
        assert dialect.reads.plain_ready(c, namespace="default") == 1
        assert dialect.hot.ready_exists(c, namespace="default") is True
    with transaction.atomic(using=topics.alias), connections[topics.alias].cursor() as c:
        claimed = dialect.hot.claim(
            c, ClaimRequest(namespace="default", owner="plain", limit=10, lease_ms=30_000)
        )
    assert [job.id for job in claimed] == [plain]


# -- running in order -------------------------------------------------------------
def test_a_server_runs_each_key_in_enqueue_order_one_at_a_time(topics, record):
    keys = [f"key-{i}" for i in range(6)]
    for n in range(8):
        for key in keys:
            later.enqueue_to_partition(Ordered(key, n, seconds=0.002, fail_first=(n == 3)))
    for n in range(3):
        later.enqueue_to_partition(OrderedSync("sync", n, seconds=0.002))

    async def body(server):
        async def all_done() -> bool:
            counts = await in_thread(later.stage_counts)
            return counts["success"] == 6 * 8 + 3

        await await_until(all_done, 30)

    serve(body, workers=4)
    runs = stored_runs(record, final_attempts(topics))
    assert order_violations(runs) == []
    assert checked_pairs(runs) == 6 * 8 + 2  # 9 stored runs per key (one failed), 3 sync
    assert [run.n for run in runs["sync"]] == [0, 1, 2]
    assert [run.n for run in runs["key-0"]] == [0, 1, 2, 3, 3, 4, 5, 6, 7]


def keys_in_distinct_partitions(count: int) -> list[str]:
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < count:
        keys.setdefault(partition_for_key(f"key-{n}", TOPICS["ordered"]), f"key-{n}")
        n += 1
    return list(keys.values())


def test_a_heads_success_claims_its_partitions_next_head(topics, record):
    """Head after head, a partition pays one statement a job: the success of
    each head claims the next one (the partition's lease is taken once)."""
    for n in range(12):
        later.enqueue_to_partition(Ordered("k", n))

    async def body(server):
        async def all_done() -> bool:
            return (await in_thread(later.stage_counts))["success"] == 12

        await await_until(all_done, 30)
        return dict(server.partitions.counts)

    counts = serve(body, workers=2)
    assert [run.n for run in ordered_runs(record)["k"]] == list(range(12))
    assert counts[("heads", "ordered", "")] == 12
    assert counts[("claims", "ordered", "")] < 4  # the first head, and any look in between


def test_partitions_waiting_for_a_worker_take_turns(topics, record):
    """With fewer workers than partitions that have work, a partition whose
    head finished goes behind the others waiting (its success claims no next
    head then): none waits for another's whole backlog."""
    keys = keys_in_distinct_partitions(3)
    for n in range(4):
        for key in keys:
            later.enqueue_to_partition(Ordered(key, n))

    async def body(server):
        async def all_done() -> bool:
            return (await in_thread(later.stage_counts))["success"] == 12

        await await_until(all_done, 30)

    serve(body, workers=1)
    runs = ordered_runs(record)
    assert max(runs[key][0].start for key in keys) < min(runs[key][-1].start for key in keys)


def test_a_next_head_no_worker_took_is_given_back_at_shutdown(topics, record):
    """A head's success claimed the next one, but no worker took it before
    the server stopped: it is given back, ready for the next server at once,
    and never ran here."""
    first = later.enqueue_to_partition(Ordered("k", 0))
    second = later.enqueue_to_partition(Ordered("k", 1))

    def first_claim_only(server) -> None:
        claim, claims = server.partitions.claim, []

        async def claim_once():
            if claims:
                return None  # no worker takes anything more
            claims.append(1)
            return await claim()

        server.partitions.claim = claim_once

    async def body(server):
        async def chained() -> bool:
            stages = await in_thread(lambda: [later.get_job(i).stage for i in (first, second)])
            return stages == ["success", "running"]

        await await_until(chained, 15)

    serve(body, workers=1, before_start=first_claim_only)
    assert [run.n for run in ordered_runs(record)["k"]] == [0]
    assert topics.rows(
        f"SELECT stage, lease_owner, attempts, uncounted FROM later_job WHERE id = '{second}'"
    ) == [("enqueued", None, 1, 1)]  # its attempt given back, not counted
    assert topics.rows("SELECT owner FROM later_partition") == [(None,)]


def test_a_delayed_head_blocks_its_partition_until_due(topics, record):
    first = later.enqueue_to_partition_delayed(Ordered("k", 0), timedelta(milliseconds=600))
    second = later.enqueue_to_partition(Ordered("k", 1))

    async def body(server):
        await await_until(lambda: _success(second), 15)

    serve(body, workers=2)
    runs = ordered_runs(record)["k"]
    assert [run.n for run in runs] == [0, 1]
    assert later.get_job(first).started_at <= later.get_job(second).started_at


async def _success(job_id: str) -> bool:
    info = await in_thread(later.get_job, job_id)
    return info.stage == "success"


def test_a_waiting_continuation_blocks_its_partition_until_its_parent_succeeds(topics, record):
    parent = later.enqueue_delayed(Noop(n=1), timedelta(milliseconds=500))
    child = later.enqueue_continue_to_partition(parent, Ordered("k", 0))
    after = later.enqueue_to_partition(Ordered("k", 1))

    async def body(server):
        await await_until(lambda: _success(after), 15)

    serve(body, workers=2)
    assert [run.n for run in ordered_runs(record)["k"]] == [0, 1]
    assert later.get_job(child).started_at >= later.get_job(parent).finished_at


def test_force_fail_frees_a_poison_head_and_blocks_no_other_partition(topics, record):
    poison = later.enqueue_to_partition_delayed(Ordered("poison", 0), timedelta(hours=1))
    blocked = later.enqueue_to_partition(Ordered("poison", 1))
    other_key = next(
        k
        for k in (f"o{i}" for i in range(100))
        if partition_for_key(k, 8) != partition_for_key("poison", 8)
    )
    free = later.enqueue_to_partition(Ordered(other_key, 0))
    partition = later.get_job(poison).partition

    async def body(server):
        await await_until(lambda: _success(free), 15)
        assert (await in_thread(later.get_job, blocked)).stage == "enqueued"
        failed = await in_thread(later.force_fail_partition_head, "ordered", partition)
        assert failed == poison
        await await_until(lambda: _success(blocked), 15)

    serve(body, workers=2)
    info = later.get_job(poison)
    assert info.stage == "failed" and "force" in info.last_error


# -- sequential recurring jobs ------------------------------------------------------
def tick_runs(record) -> list[tuple[float, float, str]]:
    """(start, end, job id) of every tick and chained child, in start order."""
    starts, ends = {}, {}
    for r in read_records(record):
        if r.kind == "tick-start":
            starts[r.job_id] = r.start
        elif r.kind == "tick-end":
            ends[r.job_id] = r.start
    return sorted(
        (start, ends.get(job_id, float("inf")), job_id) for job_id, start in starts.items()
    )


def test_a_sequential_recurring_job_that_outlasts_its_period_never_overlaps(
    later_db, settings, record
):
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=4)
    first = later.enqueue_recurring_sequential(
        "slow", SlowTick(seconds=0.7, chain=True), "* * * * * *"
    )
    assert later.get_job(first).topic == "later:recurring"

    async def body(server):
        async def enough() -> bool:
            return len(await in_thread(read_records, record, "tick-end")) >= 6

        await await_until(enough, 30)

    serve(body, workers=4)
    runs = tick_runs(record)
    assert len(runs) >= 6
    for before, after in zip(runs, runs[1:], strict=False):
        assert after[0] >= before[1], f"{after} started before {before} ended"
    # Chained children ran too, each after its occurrence, in the same line.
    started = {job_id: start for start, _, job_id in runs}
    children = [later.get_job(j) for j in started if later.get_job(j).parent_id]
    assert children
    for child in children:
        assert child.topic == "later:recurring"
        assert started[child.id] > started[child.parent_id]


def test_sequential_recurring_needs_its_setting_and_continue_needs_a_sequential_parent(later_db):
    with pytest.raises(ValueError, match="RECURRING_SEQUENTIAL_PARTITIONS"):
        later.enqueue_recurring_sequential("x", SlowTick(seconds=0), "* * * * *")
    assert later.list_recurring() == []
    plain = later.enqueue(Noop())
    with pytest.raises(ValueError, match="not an occurrence"):
        later.enqueue_recurring_continue(plain, Noop())


def test_the_plain_claim_reads_the_ready_index_which_holds_no_partition_job(topics):
    """The ready index's predicate says topic IS NULL, and the plain claim's
    terms imply it, so the claim keeps its index plan and never reads a
    partition job's entry (docs/explanation/design.md, the lane rule)."""
    claim_select = (
        "SELECT id FROM later_job WHERE namespace = 'default' AND queue = '' "
        "AND stage = 'enqueued' AND topic IS NULL ORDER BY priority DESC, id LIMIT 8"
    )
    with connections[topics.alias].cursor() as c:
        if topics.vendor == "sqlite":
            c.execute("SELECT sql FROM sqlite_master WHERE name = 'later_job_ready'")
            # As Django wrote it (migration 0010), or as migration 0014 did.
            assert re.search(r'"?topic"? IS NULL', c.fetchone()[0])
            c.execute(f"EXPLAIN QUERY PLAN {claim_select}")
            plan = " ".join(str(row[-1]) for row in c.fetchall())
        else:
            c.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'later_job_ready'")
            assert "topic IS NULL" in c.fetchone()[0]
            with transaction.atomic(using=topics.alias):
                c.execute("SET LOCAL enable_seqscan = off")
                c.execute(f"EXPLAIN {claim_select}")
                plan = " ".join(str(row[0]) for row in c.fetchall())
    assert "later_job_ready" in plan, plan


@dataclass
class Keyed:
    def partition_key(self) -> str:
        return "k"


def test_a_topic_name_must_be_one_later_topics_accepts():
    """The reserved topic has a ':' that no @job topic may take."""

    def handler(ctx: later.JobContext, payload: Keyed) -> None: ...

    for bad in ("later:recurring", "", "a b"):
        with pytest.raises(TypeError, match="topic name"):
            later.job(topic=bad)(handler)
