"""What the modules of the conformance suite share: its constants, and the
helpers that write and read rows as the worker and the API do.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections, transaction

from later_django.db import dialect_for
from later_django.db.postgresql import connect_kwargs
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    FanInInsert,
    HeadsStored,
    HeadSuccesses,
    LogAppend,
    LogPartitionKey,
    LogTopicRow,
    OwnerFence,
    PartitionClaimRequest,
    PartitionCompletion,
    PartitionHead,
    PartitionSlot,
    SuccessBatch,
)
from later_django.ids import new_job_id
from later_django.states import Stage
from later_django.types import ClaimedJob, NewJob, PartitionLane

NS = "default"
OWNER = "server-a"
LEASE_MS = 30_000
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


@contextmanager
def cursor_of(later_db, *, atomic: bool = False) -> Iterator[Any]:
    if atomic:
        with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
            yield c
        return
    with connections[later_db.alias].cursor() as c:
        yield c


def db_now(later_db) -> int:
    """The database's clock, in epoch ms."""
    return int(later_db.scalar(f"SELECT {dialect_for(later_db.alias).vendor_sql.now}"))


def new_job(**fields: Any) -> NewJob:
    values: dict[str, Any] = {
        "id": new_job_id(),
        "namespace": NS,
        "type_name": "conformance.Job",
        "payload": b"\x81\xa1n\x01",
        "priority": 0,
        "retry_policy": None,
    }
    return NewJob(**{**values, **fields})


def insert(later_db, **fields: Any) -> str:
    job = new_job(**fields)
    dialect_for(later_db.alias).enqueue.insert_one(connections[later_db.alias], job, prepare=True)
    return job.id


def insert_child(later_db, parent: str, retention_ms: int = DAY_MS) -> tuple[str, str | None]:
    job = new_job(parent_id=parent)
    with cursor_of(later_db) as c:
        stage = dialect_for(later_db.alias).enqueue.insert_continuation(c, job, retention_ms)
    return job.id, stage


def insert_fan_in(
    later_db, parents: list[str], retention_ms: int = DAY_MS, **fields: Any
) -> tuple[str, FanInInsert]:
    """A fan-in child of ``parents``, as enqueue writes it (one transaction)."""
    job = new_job(parent_id=parents[0], parents=tuple(parents), **fields)
    with cursor_of(later_db, atomic=True) as c:
        inserted = dialect_for(later_db.alias).enqueue.insert_fan_in(c, job, retention_ms)
    return job.id, inserted


def fan_in_rows(later_db) -> list[tuple[str, str]]:
    """Every (child, parent) row of later_fan_in, in order."""
    rows = later_db.rows("SELECT child_id, parent_id FROM later_fan_in ORDER BY 1, 2")
    return [(str(child), str(parent)) for child, parent in rows]


def finish_unseen(later_db, stage: str, *job_ids: str) -> None:
    """End jobs without their finish seeing any child, as a finish that
    committed before a child's insert did."""
    for job_id in job_ids:
        later_db.execute(
            "UPDATE later_job SET stage = %s, lease_owner = NULL, lease_expires_ms = NULL "
            "WHERE id = %s",
            [stage, job_id],
        )


COLUMNS = (
    "stage",
    "attempts",
    "uncounted",
    "lease_owner",
    "lease_expires_ms",
    "changed_ms",
    "history",
    "last_error",
    "run_at_ms",
    "created_ms",
    "started_ms",
    "finished_ms",
    "expires_ms",
    "retry_policy",
    "priority",
    "parent_id",
)


def job_row(later_db, job_id: str) -> dict[str, Any]:
    rows = later_db.rows(f"SELECT {', '.join(COLUMNS)} FROM later_job WHERE id = %s", [job_id])
    assert rows, f"job {job_id} does not exist"
    row = dict(zip(COLUMNS, rows[0], strict=True))
    _assert_history_sane(row)
    return row


def _assert_history_sane(row: dict[str, Any]) -> None:
    """The history ends with the row's stage at its changed_ms, and never goes back."""
    entries = [entry.split("@") for entry in row["history"].split(";") if entry]
    times = [int(at) for _, at in entries]
    assert times == sorted(times), row["history"]
    assert entries[-1] == [row["stage"], str(row["changed_ms"])], row


def stages(later_db, *job_ids: str) -> list[str]:
    return [job_row(later_db, job_id)["stage"] for job_id in job_ids]


def assert_counts(later_db) -> None:
    """The counters say what COUNT(*) says, for every stage of every namespace."""
    dialect = dialect_for(later_db.alias)
    for namespace in (NS, "other"):
        counted = dict.fromkeys(Stage.values, 0)
        for stage, n in later_db.rows(
            "SELECT stage, COUNT(*) FROM later_job WHERE namespace = %s GROUP BY stage",
            [namespace],
        ):
            counted[str(stage)] = int(n)  # type: ignore[call-overload]
        with cursor_of(later_db) as c:
            assert dialect.reads.stage_counts(c, namespace=namespace) == counted


def age(later_db, column: str, job_id: str, by_ms: int) -> None:
    """Move a time of the row ``by_ms`` into the past, as if that much time passed."""
    with cursor_of(later_db) as c:
        c.execute(f"UPDATE later_job SET {column} = {column} - %s WHERE id = %s", [by_ms, job_id])


def on_async_connection(later_db, op: Callable[[psycopg.AsyncConnection[Any]], Any]) -> Any:
    """Run ``op`` on an autocommit asyncio connection, as the worker's own session does."""

    async def run() -> Any:
        conn = await psycopg.AsyncConnection.connect(
            autocommit=True, **connect_kwargs(later_db.alias)
        )
        try:
            return await op(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


def claim(
    later_db,
    *,
    owner: str = OWNER,
    limit: int = 1,
    lease_ms: int = LEASE_MS,
    namespace: str = NS,
    queue: str = "default",
) -> list[ClaimedJob]:
    """The worker's claim, through the pair the dialect's capability names."""
    dialect = dialect_for(later_db.alias)
    request = ClaimRequest(
        namespace=namespace, owner=owner, limit=limit, lease_ms=lease_ms, queue=queue
    )
    if dialect.supports_async_connection:

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[ClaimedJob]:
            async with conn.cursor() as cursor:
                return await dialect.hot.aclaim(cursor, request, prepare=True)

        return on_async_connection(later_db, op)  # type: ignore[no-any-return]
    with cursor_of(later_db) as c:
        return dialect.hot.claim(c, request)


def complete(
    later_db,
    jobs: list[tuple[str, int]],
    *,
    owner: str = OWNER,
    retention_ms: int = DAY_MS,
    results: list[Any] | None = None,
) -> Completion:
    """The worker's batch completion, through the pair its capability names."""
    dialect = dialect_for(later_db.alias)
    batch = SuccessBatch(owner=owner, jobs=jobs, retention_ms=retention_ms, results=results or [])
    if dialect.supports_async_connection:
        return on_async_connection(  # type: ignore[no-any-return]
            later_db, lambda conn: dialect.hot.acomplete_many(conn, batch, prepare=True)
        )
    with cursor_of(later_db, atomic=True) as c:
        return dialect.hot.complete_many(c, batch)


def claim_one(later_db, job_id: str, **kwargs: Any) -> ClaimedJob:
    claimed = claim(later_db, **kwargs)
    assert [job.id for job in claimed] == [job_id]
    return claimed[0]


def owned(job: ClaimedJob, owner: str = OWNER) -> OwnerFence:
    return OwnerFence(job_id=job.id, attempts=job.attempts, owner=owner)


def commit_elsewhere(later_db) -> None:
    """Commit a write on another connection (another thread's)."""

    def write() -> None:
        try:
            with connections[later_db.alias].cursor() as c:
                dialect_for(later_db.alias).partitions.topic_register(
                    c, namespace=NS, name=new_job_id(), partitions=1
                )
        finally:
            connections.close_all()

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(30)


# -- sequential partition mode ----------------------------------------------------------


ORDERS = PartitionLane(NS, "orders", 3)


def insert_partitioned(later_db, lane: PartitionLane = ORDERS, **fields: Any) -> tuple[str, int]:
    """Insert a job at the next sequence of ``lane``; return (id, sequence)."""
    job = new_job(**fields)
    with cursor_of(later_db, atomic=True) as c:
        dialect = dialect_for(later_db.alias)
        sequence = dialect.partitions.partition_next_sequence(c, lane)
        stage = dialect.partitions.insert_partitioned(c, job, PartitionSlot(lane, sequence), DAY_MS)
    assert stage is not None
    return job.id, sequence


def claim_head(later_db, owner: str, *, partition_lease_ms: int = LEASE_MS, lane=ORDERS):
    """The worker's claim of a partition head, through the operation its
    capability names (on the asyncio connection where it has one)."""
    request = PartitionClaimRequest(
        lane=lane,
        owner=owner,
        partition_lease_ms=partition_lease_ms,
        job_lease_ms=LEASE_MS,
        server_ttl_ms=LEASE_MS,
    )
    dialect = dialect_for(later_db.alias)
    if dialect.supports_async_connection:
        return on_async_connection(
            later_db, lambda conn: dialect.partitions.apartition_claim(conn, request, prepare=True)
        )
    with cursor_of(later_db, atomic=True) as c:
        return dialect.partitions.partition_claim(c, request)


def complete_head(later_db, done: PartitionCompletion) -> bool:
    """The worker's success of a partition head, as claim_head claims it."""
    batch = HeadSuccesses(
        owner=done.owner, heads=[done.job], chain=[False], retention_ms=done.retention_ms
    )
    return bool(complete_heads(later_db, batch).done_ids)


def complete_heads(later_db, batch: HeadSuccesses) -> HeadsStored:
    """The worker's batch of heads' successes (on the asyncio connection
    where it has one)."""
    dialect = dialect_for(later_db.alias)
    if dialect.supports_async_connection:
        return on_async_connection(  # type: ignore[no-any-return]
            later_db,
            lambda conn: dialect.partitions.apartition_complete_many(conn, batch, prepare=True),
        )
    with cursor_of(later_db, atomic=True) as c:
        return dialect.partitions.partition_complete_many(c, batch)


def heads_of(later_db) -> list[PartitionHead]:
    """The worker's look for ready heads, as claim_head claims them."""
    dialect = dialect_for(later_db.alias)
    if dialect.supports_async_connection:
        return on_async_connection(  # type: ignore[no-any-return]
            later_db,
            lambda conn: dialect.partitions.apartition_heads(conn, namespace=NS, prepare=True),
        )
    with cursor_of(later_db) as c:
        return dialect.partitions.partition_heads(c, namespace=NS)


# -- the retained log -------------------------------------------------------------------


def log_topic(later_db, dialect, partitions: int = 2) -> None:
    row = LogTopicRow(name="events", partitions=partitions, retention_ms=None)
    with cursor_of(later_db) as c:
        assert dialect.log.log_topic_register(c, row, NS)


def log_part(partition: int = 0) -> LogPartitionKey:
    return LogPartitionKey(namespace=NS, topic="events", partition=partition)


def log_append(later_db, dialect, values: list[bytes], partition: int = 0) -> int:
    """Append ``values`` to one partition; return its new end."""
    append = LogAppend(
        namespace=NS,
        topic="events",
        partitions=2,
        groups=[(partition, [(b"k", v) for v in values])],
    )
    with cursor_of(later_db, atomic=True) as c:
        firsts = dialect.log.log_append(c, append, prepare=True)
    assert firsts is not None
    return firsts[partition] + len(values)
