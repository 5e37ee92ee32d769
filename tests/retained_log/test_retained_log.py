"""The retained log's public API on both databases: topics, appends and reads,
consumer group leases and commits, lag, retention, consume() and the lag metric.

Concurrent appenders and a killed consumer run in real processes:
tests/retained_log/test_retained_log_processes.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from asgiref.sync import sync_to_async
from django.core.checks import run_checks
from django.db import connections, transaction
from prometheus_client import CollectorRegistry, generate_latest

from later_django import LeaseLost, NotMigrated, metrics, partition_for_key
from later_django import retained_log as log
from later_django.db import dialect_for
from later_django.leases import Leader
from later_django.metrics import gauges
from later_django.retained_log import retention
from tests.helpers import set_later

TOPIC = "events"


def records_table(later_db, topic: str = TOPIC) -> list[tuple[object, ...]]:
    """Every stored record of ``topic`` as (partition, offset, key, value)."""
    rows = later_db.rows(
        "SELECT part, log_offset, record_key, record_value FROM later_log_record "
        "WHERE topic = %s ORDER BY part, log_offset",
        [topic],
    )
    return [(p, o, bytes(k), bytes(v)) for p, o, k, v in rows]  # type: ignore[arg-type]


def consumer_row(later_db, group: str, partition: int = 0) -> tuple[object, ...]:
    """(member, epoch, committed_offset) of a group's partition as stored."""
    return later_db.rows(
        "SELECT member, epoch, committed_offset FROM later_log_consumer "
        "WHERE topic = %s AND consumer_group = %s AND part = %s",
        [TOPIC, group, partition],
    )[0]


def expire_leases(later_db) -> None:
    """Move every consumer lease's expiry into the past, as if it ran out."""
    later_db.execute("UPDATE later_log_consumer SET expires_ms = expires_ms - 3600000")


def age_records(later_db, by_ms: int, *, below_offset: int) -> None:
    """Make the records below ``below_offset`` of every partition older."""
    later_db.execute(
        "UPDATE later_log_record SET appended_ms = appended_ms - %s WHERE log_offset < %s",
        [by_ms, below_offset],
    )


# -- topics ------------------------------------------------------------------------------


def test_register_topic_is_idempotent_and_refuses_a_changed_count(later_db):
    """Registering again with the same count only updates the retention; another
    count is refused with the stored count in the message, and nothing changes."""
    log.register_topic(TOPIC, partitions=4)
    log.register_topic(TOPIC, partitions=4, retention=dt.timedelta(hours=1))
    stored = "SELECT partitions, retention_ms FROM later_log_topic WHERE name = %s"
    assert later_db.rows(stored, [TOPIC]) == [(4, 3_600_000)]
    with pytest.raises(ValueError, match=r"registered with 4 partitions, not 8.*keep partitions=4"):
        log.register_topic(TOPIC, partitions=8, retention=dt.timedelta(days=9))
    assert later_db.rows(stored, [TOPIC]) == [(4, 3_600_000)]
    # Job topics are another table: a retained-log topic never drives a poller.
    assert later_db.scalar("SELECT COUNT(*) FROM later_topic") == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": "bad name!", "partitions": 1}, ValueError, "not a valid topic name"),
        ({"name": "", "partitions": 1}, ValueError, "not a valid topic name"),
        ({"name": "t", "partitions": 0}, ValueError, "partitions is 0; it must be from 1"),
        ({"name": "t", "partitions": True}, TypeError, "partitions must be an int"),
        (
            {"name": "t", "partitions": 1, "retention": dt.timedelta(0)},
            ValueError,
            "pass a positive timedelta",
        ),
        ({"name": "t", "partitions": 1, "retention": 60}, ValueError, "pass a positive timedelta"),
    ],
)
def test_register_topic_refuses_bad_input_and_writes_nothing(later_db, kwargs, error, message):
    arguments = dict(kwargs)  # shared by both databases' runs
    name = arguments.pop("name")
    with pytest.raises(error, match=message):
        log.register_topic(name, **arguments)
    assert later_db.scalar("SELECT COUNT(*) FROM later_log_topic") == 0


def test_calls_on_an_unregistered_topic_name_the_fix(later_db):
    """append, read, acquire and lag of an unknown topic say to register it."""
    fix = r"not registered in namespace 'default'; call retained_log.register_topic"
    with pytest.raises(ValueError, match=fix):
        log.append("nope", key="k", value=b"v")
    with pytest.raises(ValueError, match=fix):
        log.read("nope", 0)
    with pytest.raises(ValueError, match=fix):
        log.acquire("nope", group="g", partition=0, member="m")
    with pytest.raises(ValueError, match=fix):
        log.lag("nope")
    assert later_db.scalar("SELECT COUNT(*) FROM later_log_partition") == 0


# -- append and read -----------------------------------------------------------------


def test_append_places_by_key_and_read_replays_in_order(later_db):
    """A record goes to partition_for_key(key, count); offsets start at 0 and
    grow by one per partition; a str key is stored as its UTF-8 bytes."""
    log.register_topic(TOPIC, partitions=3)
    appended = []
    for n in range(12):
        key = f"customer-{n % 4}"
        where = log.append(TOPIC, key=key if n % 2 else key.encode(), value=b"v%d" % n)
        assert where[0] == partition_for_key(key, 3)
        appended.append((*where, key.encode(), b"v%d" % n))
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _, _ in appended:
        by_partition.setdefault(partition, []).append(offset)
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))
    assert records_table(later_db) == sorted(appended)

    partition = appended[0][0]
    expected = [(o, k, v) for p, o, k, v in appended if p == partition]
    records = log.read(TOPIC, partition)
    assert [(r.offset, r.key, r.value) for r in records] == expected
    assert all(r.partition == partition for r in records)
    now = dt.datetime.now(dt.UTC)
    assert all(abs(r.appended_at - now) < dt.timedelta(minutes=1) for r in records)
    # Positional arguments, a start offset and a limit.
    assert [r.offset for r in log.read(TOPIC, partition, 1, 2)] == [1, 2]
    assert log.read(TOPIC, partition, from_offset=len(expected)) == []


def test_append_many_is_one_transaction_in_the_given_order(later_db):
    """Records of one partition take consecutive offsets in the order given;
    the result lists (partition, offset) in input order."""
    log.register_topic(TOPIC, partitions=2)
    log.append(TOPIC, key="x", value=b"first")
    pairs = [(f"k{n}", b"%d" % n) for n in range(50)]
    placed = log.append_many(TOPIC, pairs)
    assert [p for p, _ in placed] == [partition_for_key(k, 2) for k, _ in pairs]
    for partition in (0, 1):
        offsets = [o for p, o in placed if p == partition]
        start = 1 if partition == partition_for_key("x", 2) else 0
        assert offsets == list(range(start, start + len(offsets)))
        values = [r.value for r in log.read(TOPIC, partition, start, 100)]
        assert values == [v for (k, v), (p, _) in zip(pairs, placed, strict=True) if p == partition]
    assert log.append_many(TOPIC, []) == []


def test_appends_above_one_statement_place_records_as_smaller_ones(later_db):
    """PostgreSQL writes an append of up to 1,000 records in one statement
    and a larger one a statement per step: both give gapless offsets in the
    order given, following each other."""
    log.register_topic(TOPIC, partitions=3)
    small = [(f"s{n}", b"s%d" % n) for n in range(900)]
    large = [(f"l{n}", b"l%d" % n) for n in range(2500)]
    placed = log.append_many(TOPIC, small) + log.append_many(TOPIC, large)
    pairs = small + large
    for partition in range(3):
        offsets = [o for p, o in placed if p == partition]
        assert offsets == list(range(len(offsets)))
        stored = [r.value for r in log.read(TOPIC, partition, 0, 10_000)]
        assert stored == [v for (_, v), (p, _) in zip(pairs, placed, strict=True) if p == partition]


@pytest.mark.parametrize(
    ("records", "error", "message"),
    [
        ([("a", b"1"), ("b", "text")], TypeError, r"records\[1\] value must be bytes"),
        ([("a", b"1"), (7, b"2")], TypeError, r"records\[1\] key must be str or bytes"),
        ([("a", b"1"), ("b",)], TypeError, r"records\[1\] must be a \(key, value\) tuple"),
        ([("a", b"x" * 2000)], ValueError, r"more than LATER\['MAX_PAYLOAD_BYTES'\]"),
    ],
)
def test_append_many_refuses_bad_records_and_writes_nothing(
    later_db, settings, records, error, message
):
    set_later(settings, MAX_PAYLOAD_BYTES=1000)
    log.register_topic(TOPIC, partitions=2)
    with pytest.raises(error, match=message):
        log.append_many(TOPIC, records)
    assert records_table(later_db) == []
    assert later_db.scalar("SELECT COUNT(*) FROM later_log_partition") == 0


def test_append_in_a_rolled_back_atomic_leaves_no_record_and_no_gap(later_db):
    """The append joins the caller's transaction: rolled back, its record and
    its offset are gone, and the next append takes that offset."""
    log.register_topic(TOPIC, partitions=1)
    assert log.append(TOPIC, key="a", value=b"kept") == (0, 0)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic(using=later_db.alias):
        assert log.append(TOPIC, key="b", value=b"lost") == (0, 1)
        assert log.append_many(TOPIC, [("c", b"lost too")]) == [(0, 2)]
        assert [r.value for r in log.read(TOPIC, 0)] == [b"kept", b"lost", b"lost too"]
        raise Abort
    assert [r.value for r in log.read(TOPIC, 0)] == [b"kept"]
    assert log.append(TOPIC, key="d", value=b"next") == (0, 1)
    assert [(r.offset, r.value) for r in log.read(TOPIC, 0)] == [(0, b"kept"), (1, b"next")]


def test_read_refuses_bad_arguments(later_db):
    log.register_topic(TOPIC, partitions=2)
    with pytest.raises(ValueError, match=r"partition is 2, but topic 'events' has 2 partitions"):
        log.read(TOPIC, 2)
    with pytest.raises(ValueError, match="from_offset is -1"):
        log.read(TOPIC, 0, -1)
    with pytest.raises(ValueError, match="limit is 0; it must be from 1 to 10000"):
        log.read(TOPIC, 0, 0, 0)


def test_calls_before_later_migrate_raise_not_migrated(later_db):
    """A missing table names later_migrate rather than a raw database error."""
    later_db.execute("ALTER TABLE later_log_record RENAME TO later_log_record_away")
    try:
        log.register_topic(TOPIC, partitions=1)
        with pytest.raises(NotMigrated, match="later_migrate"):
            log.append(TOPIC, key="k", value=b"v")
    finally:
        later_db.execute("ALTER TABLE later_log_record_away RENAME TO later_log_record")


# -- consumer groups --------------------------------------------------------------------


def test_only_the_lease_holder_commits_and_a_superseded_one_changes_nothing(later_db):
    """Two members of one group: the second gets None while the first holds the
    partition; after a takeover the first's commit and renew raise LeaseLost
    and the stored offset stays the new holder's."""
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(10)])
    first = log.acquire(TOPIC, group="billing", partition=0, member="host-1")
    assert first is not None
    assert (first.epoch, first.committed_offset) == (1, 0)
    assert log.acquire(TOPIC, group="billing", partition=0, member="host-2") is None
    # Another group has a lease and an offset of its own.
    other = log.acquire(TOPIC, group="search", partition=0, member="host-2")
    assert other is not None
    first.commit(4)
    first.renew()
    assert first.committed_offset == 4
    assert consumer_row(later_db, "billing") == ("host-1", 1, 4)

    expire_leases(later_db)
    second = log.acquire(TOPIC, group="billing", partition=0, member="host-2")
    assert second is not None
    assert (second.epoch, second.committed_offset) == (2, 4)
    second.commit(6)
    with pytest.raises(LeaseLost, match=r"commit refused.*epoch 1 was taken over"):
        first.commit(8)
    with pytest.raises(LeaseLost, match="renew refused"):
        first.renew()
    assert first.release() is False
    assert consumer_row(later_db, "billing") == ("host-2", 2, 6)
    assert consumer_row(later_db, "search") == ("host-2", 1, 0)


def test_a_member_that_acquires_again_fences_its_earlier_lease(later_db):
    """A restarted member (same name) takes over at once with a new epoch."""
    log.register_topic(TOPIC, partitions=1)
    old = log.acquire(TOPIC, group="g", partition=0, member="m")
    new = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert old is not None and new is not None
    assert new.epoch == old.epoch + 1
    with pytest.raises(LeaseLost):
        old.renew()
    new.renew()


def test_release_lets_another_member_take_over_at_once(later_db):
    log.register_topic(TOPIC, partitions=1)
    log.append(TOPIC, key="k", value=b"v")
    first = log.acquire(TOPIC, group="g", partition=0, member="a")
    assert first is not None
    first.commit(1)
    assert first.release() is True
    second = log.acquire(TOPIC, group="g", partition=0, member="b")
    assert second is not None
    assert (second.epoch, second.committed_offset) == (2, 1)


def test_commit_refuses_offsets_behind_or_past_the_end(later_db):
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"1"), ("k", b"2"), ("k", b"3")])
    lease = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert lease is not None
    lease.commit(2)
    with pytest.raises(ValueError, match=r"next_offset 1 is behind the committed offset 2"):
        lease.commit(1)
    with pytest.raises(ValueError, match=r"past the end of events/0 \(3 records appended\)"):
        lease.commit(4)
    with pytest.raises(ValueError, match="next_offset is -1"):
        lease.commit(-1)
    lease.commit(2)  # the same offset again is fine
    lease.commit(3)
    assert consumer_row(later_db, "g") == ("m", 1, 3)


def test_acquire_refuses_bad_arguments(later_db):
    log.register_topic(TOPIC, partitions=2)
    with pytest.raises(ValueError, match="group is ''"):
        log.acquire(TOPIC, group="", partition=0, member="m")
    with pytest.raises(ValueError, match="member is"):
        log.acquire(TOPIC, group="g", partition=0, member="m" * 101)
    with pytest.raises(ValueError, match="partition is 5"):
        log.acquire(TOPIC, group="g", partition=5, member="m")
    assert later_db.scalar("SELECT COUNT(*) FROM later_log_consumer") == 0


def test_commit_joins_the_callers_transaction(later_db):
    """An offset committed inside a rolled-back atomic block is not stored: the
    offset can commit together with what its records caused."""
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"1"), ("k", b"2")])
    lease = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert lease is not None
    with pytest.raises(RuntimeError), transaction.atomic(using=later_db.alias):
        lease.commit(2)
        raise RuntimeError
    assert consumer_row(later_db, "g")[2] == 0


def test_lag_is_appended_minus_committed_per_group_and_partition(later_db):
    log.register_topic(TOPIC, partitions=2)
    placed = log.append_many(TOPIC, [(f"k{n}", b"") for n in range(20)])
    ends = {p: sum(1 for q, _ in placed if q == p) for p in (0, 1)}
    leases = {
        (group, p): log.acquire(TOPIC, group=group, partition=p, member="m")
        for group in ("billing", "search")
        for p in (0, 1)
    }
    leases[("billing", 0)].commit(ends[0])  # type: ignore[union-attr]
    leases[("search", 1)].commit(2)  # type: ignore[union-attr]
    assert log.lag(TOPIC) == {
        ("billing", 0): 0,
        ("billing", 1): ends[1],
        ("search", 0): ends[0],
        ("search", 1): ends[1] - 2,
    }
    before = log.lag(TOPIC)
    log.append(TOPIC, key="k0", value=b"")
    after = log.lag(TOPIC)
    grown = partition_for_key("k0", 2)
    assert after == {k: v + (1 if k[1] == grown else 0) for k, v in before.items()}


# -- retention ---------------------------------------------------------------------------


def test_retention_deletes_only_records_older_than_the_rule(later_db):
    """Older records go, a prefix at a time; newer ones and topics without a
    retention stay. A record older than a newer one before it waits."""
    log.register_topic(TOPIC, partitions=1, retention=dt.timedelta(hours=1))
    log.register_topic("forever", partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(8)])
    log.append_many("forever", [("k", b"%d" % n) for n in range(3)])
    age_records(later_db, 2 * 3_600_000, below_offset=5)  # offsets 0-4 of both: 2 h old
    # Offset 6 is old too, but 5 before it is new: only the prefix goes.
    later_db.execute(
        "UPDATE later_log_record SET appended_ms = appended_ms - 7200000 "
        "WHERE topic = %s AND log_offset = 6",
        [TOPIC],
    )
    dialect = dialect_for(later_db.alias)
    with connections[later_db.alias].cursor() as cursor:
        topics = dialect.log.log_topic_retained(cursor, namespace="default")
        assert [t.name for t in topics] == [TOPIC]
        assert retention.prune(dialect, cursor, namespace="default", topics=topics) == 5
        assert retention.prune(dialect, cursor, namespace="default", topics=topics) == 0
    assert [r.offset for r in log.read(TOPIC, 0)] == [5, 6, 7]
    assert [r.offset for r in log.read("forever", 0)] == [0, 1, 2]
    # A read from before the oldest retained record starts at it; lag still
    # counts from the group's offset.
    assert log.read(TOPIC, 0, 0, 1)[0].offset == 5


def test_retention_step_runs_on_the_leader_once_per_interval(later_db):
    """The maintenance step prunes only on the server holding the retention
    lease, and at most once per interval in the namespace."""
    log.register_topic(TOPIC, partitions=2, retention=dt.timedelta(minutes=1))
    log.append_many(TOPIC, [(f"k{n}", b"") for n in range(10)])
    age_records(later_db, 120_000, below_offset=1000)
    dialect = dialect_for(later_db.alias)
    first = Leader(namespace="default", owner="server-a", ttl_ms=30_000)
    second = Leader(namespace="default", owner="server-b", ttl_ms=30_000)
    with connections[later_db.alias].cursor() as cursor:
        assert first.lead(dialect, cursor, retention.LEASE_NAME) is not None
        assert (
            retention.prune_retained_log(dialect, cursor, namespace="default", leader=second) == 0
        )
        assert later_db.scalar("SELECT COUNT(*) FROM later_log_record") == 10
        assert (
            retention.prune_retained_log(dialect, cursor, namespace="default", leader=first) == 10
        )
        log.append(TOPIC, key="k", value=b"")
        age_records(later_db, 120_000, below_offset=1000)
        # Ran less than INTERVAL_MS ago: not again yet.
        assert retention.prune_retained_log(dialect, cursor, namespace="default", leader=first) == 0
    assert later_db.scalar("SELECT COUNT(*) FROM later_log_record") == 1


def test_retention_step_without_retained_topics_takes_no_lease(later_db):
    """Where no topic has a retention, the step only reads: no lease row."""
    log.register_topic(TOPIC, partitions=1)
    dialect = dialect_for(later_db.alias)
    leader = Leader(namespace="default", owner="server-a", ttl_ms=30_000)
    with connections[later_db.alias].cursor() as cursor:
        assert (
            retention.prune_retained_log(dialect, cursor, namespace="default", leader=leader) == 0
        )
    assert later_db.scalar("SELECT COUNT(*) FROM later_lease") == 0


# -- consume() -------------------------------------------------------------------------


def test_consume_handles_every_record_once_and_commits(later_db):
    log.register_topic(TOPIC, partitions=3)
    placed = log.append_many(TOPIC, [(f"k{n}", b"%d" % n) for n in range(40)])
    seen: list[tuple[int, int]] = []
    result = log.consume(
        TOPIC,
        group="g",
        member="m",
        handler=lambda r: seen.append((r.partition, r.offset)),
        batch_size=7,
        until_idle=True,
    )
    assert result == log.ConsumeResult(records=40, leases_lost=0)
    assert sorted(seen) == sorted(placed)
    assert set(log.lag(TOPIC).values()) == {0}
    # Released at the end: another member takes over at once, with nothing to do.
    again = log.consume(TOPIC, group="g", member="other", handler=seen.append, until_idle=True)
    assert again.records == 0
    assert len(seen) == 40


def test_consume_commits_up_to_a_failing_record_and_reraises(later_db):
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(10)])

    def handler(record: log.Record) -> None:
        if record.offset == 6:
            raise RuntimeError("bad record")

    with pytest.raises(RuntimeError, match="bad record"):
        log.consume(TOPIC, group="g", member="m", handler=handler, batch_size=4, until_idle=True)
    assert log.lag(TOPIC) == {("g", 0): 4}
    lease = log.acquire(TOPIC, group="g", partition=0, member="next")
    assert lease is not None
    assert lease.committed_offset == 6


def test_consume_stops_when_asked(later_db):
    """Without until_idle it keeps polling until ``stop`` is set, then releases."""
    log.register_topic(TOPIC, partitions=1)
    stop = threading.Event()
    seen: list[bytes] = []

    def handler(record: log.Record) -> None:
        seen.append(record.value)
        stop.set()

    log.append(TOPIC, key="k", value=b"one")
    result = log.consume(TOPIC, group="g", member="m", handler=handler, stop=stop, idle_wait=0.01)
    assert result.records == 1
    assert seen == [b"one"]
    assert log.acquire(TOPIC, group="g", partition=0, member="other") is not None


# -- async twins -------------------------------------------------------------------------


def test_async_twins(later_db):
    async def main() -> None:
        try:
            await scenario()
        finally:
            await sync_to_async(connections.close_all)()

    async def scenario() -> None:
        await log.aregister_topic(TOPIC, partitions=1)
        assert await log.aappend(TOPIC, key="k", value=b"a") == (0, 0)
        assert await log.aappend_many(TOPIC, [("k", b"b")]) == [(0, 1)]
        assert [r.value for r in await log.aread(TOPIC, 0)] == [b"a", b"b"]
        lease = await log.aacquire(TOPIC, group="g", partition=0, member="m")
        assert lease is not None
        await lease.acommit(1)
        await lease.arenew()
        assert await log.alag(TOPIC) == {("g", 0): 1}
        assert await lease.arelease() is True
        seen: list[log.Record] = []
        result = await log.aconsume(
            TOPIC, group="g", member="m", handler=seen.append, until_idle=True
        )
        assert result.records == 1
        assert [r.value for r in seen] == [b"b"]

    asyncio.run(main())


# -- the lag setting: check and metric -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["events"], "LATER['RETAINED_LOG_LAG'] is ['events']; it must be a dict."),
        ({"bad name": None}, "'bad name' is not a valid topic name"),
        ({"events": "billing"}, "the groups of 'events' must be None or a list of names"),
        ({"events": [""]}, "the groups of 'events' must be None or a list of names"),
    ],
)
def test_check_e024_refuses_a_bad_lag_setting(settings, value, message):
    set_later(settings, RETAINED_LOG_LAG=value)
    errors = [m for m in run_checks() if m.id == "later.E024"]
    assert len(errors) == 1
    assert message in errors[0].msg
    assert "{'events': ['billing'], 'audit': None}" in (errors[0].hint or "")


def test_check_e024_accepts_a_good_lag_setting(settings):
    set_later(settings, RETAINED_LOG_LAG={"events": ["billing"], "audit": None})
    assert [m for m in run_checks() if m.id == "later.E024"] == []


def test_lag_metric_reports_the_configured_topics_and_groups(later_db, settings):
    """later_retained_log_consumer_lag sums the partitions of each (topic, group)
    that RETAINED_LOG_LAG names; other groups and topics are left out."""
    log.register_topic(TOPIC, partitions=2)
    log.register_topic("audit", partitions=1)
    log.append_many(TOPIC, [(f"k{n}", b"") for n in range(10)])
    log.append_many("audit", [("k", b"")] * 3)
    for group in ("billing", "search"):
        for partition in (0, 1):
            log.acquire(TOPIC, group=group, partition=partition, member="m")
    audit = log.acquire("audit", group="archive", partition=0, member="m")
    assert audit is not None
    audit.commit(1)
    set_later(settings, RETAINED_LOG_LAG={TOPIC: ["billing"], "audit": None})
    assert log.configured_lag() == {(TOPIC, "billing"): 10, ("audit", "archive"): 2}

    collector = gauges.LagCollector()
    collector.read, collector.max_age = metrics.read_retained_log_lag, 0.0
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'later_retained_log_consumer_lag{group="billing",topic="events"} 10.0' in text
    assert 'later_retained_log_consumer_lag{group="archive",topic="audit"} 2.0' in text
    assert "search" not in text
    set_later(settings, RETAINED_LOG_LAG={})
    assert log.configured_lag() == {}
