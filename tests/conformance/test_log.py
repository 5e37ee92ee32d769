"""The retained log (``dialect.log``): topics, offsets, records, consumer groups."""

from __future__ import annotations

import pytest

from later_django.db.rows import (
    LogAcquired,
    LogAppend,
    LogCommit,
    LogConsumerKey,
    LogConsumerState,
    LogFence,
    LogLag,
    LogLeaseRequest,
    LogPrune,
    LogRead,
    LogTopicRow,
)
from tests.conformance.helpers import (
    HOUR_MS,
    LEASE_MS,
    NS,
    cursor_of,
    db_now,
    log_append,
    log_part,
    log_topic,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


# -- the retained log -------------------------------------------------------------------


def test_log_topic_register_get_and_retained(later_db, dialect):
    """A topic is stored once per namespace; registering it again with the same
    count updates only its retention, another count changes nothing."""

    def register(name: str, partitions: int, retention_ms: int | None, ns: str = NS) -> bool:
        row = LogTopicRow(name=name, partitions=partitions, retention_ms=retention_ms)
        with cursor_of(later_db) as c:
            return dialect.log.log_topic_register(c, row, ns)

    assert register("events", 4, None) is True
    assert register("events", 4, HOUR_MS) is True
    assert register("events", 8, None) is False
    assert register("events", 2, None, ns="other") is True
    assert register("plain", 1, None) is True
    with cursor_of(later_db) as c:
        stored = dialect.log.log_topic_get(c, namespace=NS, name="events")
        assert stored == LogTopicRow(name="events", partitions=4, retention_ms=HOUR_MS)
        assert dialect.log.log_topic_get(c, namespace=NS, name="nope") is None
        assert dialect.log.log_topic_retained(c, namespace=NS) == [stored]
        assert dialect.log.log_topic_retained(c, namespace="other") == []


def test_log_append_reserves_offsets_and_records_read_back(later_db, dialect):
    """The counter starts at 0 and grows by each append's count; an append
    to a topic not stored, or stored with another count, writes nothing.
    Records carry the database's now."""
    one = [(0, [(b"k", b"v")])]
    missing = LogAppend(namespace=NS, topic="events", partitions=2, groups=one)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.log.log_append(c, missing, prepare=True) is None
    log_topic(later_db, dialect)
    stale = LogAppend(namespace=NS, topic="events", partitions=3, groups=one)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.log.log_append(c, stale, prepare=True) is None
    before = db_now(later_db)
    assert log_append(later_db, dialect, [b"a", b"b", b"c"]) == 3
    assert log_append(later_db, dialect, [b"d", b"e"]) == 5
    assert log_append(later_db, dialect, [b"x"], partition=1) == 1
    after = db_now(later_db)
    with cursor_of(later_db) as c:
        rows = dialect.log.log_record_read(c, LogRead(key=log_part(), from_offset=1, limit=3))
        other = dialect.log.log_record_read(c, LogRead(key=log_part(1), from_offset=0, limit=10))
    assert [(r.offset, r.key, r.value) for r in rows] == [
        (1, b"k", b"b"),
        (2, b"k", b"c"),
        (3, b"k", b"d"),
    ]
    assert all(before <= r.appended_ms <= after for r in rows)
    assert [(r.offset, r.value) for r in other] == [(0, b"x")]


def test_log_append_places_records_in_one_step_or_several(later_db, dialect):
    """An append reserves each partition's offsets and stores its records
    at them, whether the store writes it as one statement or several; a
    topic stored with another count gets nothing written."""
    log_topic(later_db, dialect)
    small = LogAppend(
        namespace=NS,
        topic="events",
        partitions=2,
        groups=[(0, [(b"a", b"1"), (b"b", b"2")]), (1, [(b"c", b"3")])],
    )
    assert dialect.log.log_append_is_one_statement(1) in (True, False)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.log.log_append(c, small, prepare=True) == {0: 0, 1: 0}
    large = LogAppend(
        namespace=NS, topic="events", partitions=2, groups=[(0, [(b"k", b"x")] * 1500)]
    )
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.log.log_append(c, large, prepare=True) == {0: 2}
    stale = LogAppend(namespace=NS, topic="events", partitions=3, groups=[(0, [(b"k", b"y")])])
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.log.log_append(c, stale, prepare=True) is None
    with cursor_of(later_db) as c:
        zero = dialect.log.log_record_read(c, LogRead(key=log_part(), from_offset=0, limit=5000))
        one = dialect.log.log_record_read(c, LogRead(key=log_part(1), from_offset=0, limit=10))
    assert [r.value for r in zero] == [b"1", b"2"] + [b"x"] * 1500
    assert [r.offset for r in zero] == list(range(1502))
    assert [(r.offset, r.key, r.value) for r in one] == [(0, b"c", b"3")]


def test_log_record_prune_deletes_the_prefix_older_than_the_cutoff(later_db, dialect):
    log_topic(later_db, dialect)
    log_append(later_db, dialect, [b"%d" % n for n in range(6)])
    log_append(later_db, dialect, [b"other"], partition=1)
    with cursor_of(later_db) as c:
        c.execute(
            "UPDATE later_log_record SET appended_ms = appended_ms - %s "
            "WHERE log_offset IN (0, 1, 2, 4)",
            [2 * HOUR_MS],
        )
        prune = LogPrune(key=log_part(), older_than_ms=HOUR_MS, limit=2)
        assert dialect.log.log_record_prune(c, prune) == 2  # looks at 2 records only
        again = LogPrune(key=log_part(), older_than_ms=HOUR_MS, limit=100)
        assert dialect.log.log_record_prune(c, again) == 1  # 3 is new: 4 waits
        assert dialect.log.log_record_prune(c, again) == 0
        left = dialect.log.log_record_read(c, LogRead(key=log_part(), from_offset=0, limit=10))
        other = dialect.log.log_record_read(c, LogRead(key=log_part(1), from_offset=0, limit=10))
    assert [r.offset for r in left] == [3, 4, 5]
    assert len(other) == 1


def test_log_consumer_lease_is_fenced_by_epoch_on_the_database_clock(later_db, dialect):
    """One member at a time until the database's now plus the lease; each take
    a higher epoch; renew, commit and release hold only at the holder's epoch;
    a commit stays within committed..end; lag is end minus committed."""
    log_topic(later_db, dialect)
    log_append(later_db, dialect, [b"a", b"b", b"c"])
    key = LogConsumerKey(namespace=NS, topic="events", group="billing", partition=0)

    def acquire(member: str, partition: int = 0) -> LogAcquired | None:
        where = LogConsumerKey(namespace=NS, topic="events", group="billing", partition=partition)
        with cursor_of(later_db) as c:
            return dialect.log.log_consumer_acquire(
                c, LogLeaseRequest(key=where, member=member, ttl_ms=LEASE_MS)
            )

    def expires() -> int:
        return int(later_db.scalar("SELECT expires_ms FROM later_log_consumer WHERE part = 0"))  # type: ignore[arg-type]

    def commit(epoch: int, offset: int) -> bool:
        fence = LogFence(key=key, epoch=epoch)
        with cursor_of(later_db) as c:
            return dialect.log.log_consumer_commit(
                c, LogCommit(fence=fence, next_offset=offset, ttl_ms=LEASE_MS)
            )

    assert acquire("a", partition=2) is None, "the topic has no partition 2"
    before = db_now(later_db)
    assert acquire("a") == LogAcquired(epoch=1, committed_offset=0)
    assert before + LEASE_MS <= expires() <= db_now(later_db) + LEASE_MS
    assert acquire("b") is None
    assert commit(1, 2) is True
    assert commit(1, 1) is False, "behind the committed offset"
    assert commit(1, 4) is False, "past the end"
    with cursor_of(later_db) as c:
        assert dialect.log.log_consumer_state(c, key) == LogConsumerState(
            epoch=1, committed_offset=2, end_offset=3
        )
        c.execute("UPDATE later_log_consumer SET expires_ms = expires_ms - %s", [2 * LEASE_MS])
        assert dialect.log.log_consumer_renew(c, LogFence(key=key, epoch=1), LEASE_MS) is True
        c.execute("UPDATE later_log_consumer SET expires_ms = expires_ms - %s", [2 * LEASE_MS])
    assert acquire("b") == LogAcquired(epoch=2, committed_offset=2)
    assert commit(1, 3) is False, "a superseded holder"
    with cursor_of(later_db) as c:
        assert dialect.log.log_consumer_renew(c, LogFence(key=key, epoch=1), LEASE_MS) is False
        assert dialect.log.log_consumer_release(c, LogFence(key=key, epoch=1)) is False
        assert dialect.log.log_lag(c, namespace=NS, topic="events") == [
            LogLag(group="billing", partition=0, lag=1)
        ]
        assert dialect.log.log_consumer_release(c, LogFence(key=key, epoch=2)) is True
        other = LogConsumerKey(namespace=NS, topic="events", group="other", partition=0)
        assert dialect.log.log_consumer_state(c, other) is None
    assert acquire("a") == LogAcquired(epoch=3, committed_offset=2)
