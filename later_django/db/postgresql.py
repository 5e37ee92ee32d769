"""PostgreSQL: SKIP LOCKED claims, statement-level counter triggers, NOTIFY.

The worker's claims and completions run on an asyncio connection of its own
(db/sessions.py), as prepared statements; the same statements run on a
Django cursor for callers inside a transaction of their own (testing's
drain()). Enqueues run straight on the psycopg connection under Django's.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.conf import conf
from later_django.db.base import TABLES, Dialect
from later_django.db.errors import UNDEFINED_TABLE, sqlstate
from later_django.db.jobs import JobEngine, insert_one, queue_filter_params
from later_django.db.limits import LimitStore
from later_django.db.partitions import PartitionStore, partition_heads
from later_django.db.past_django import log_query, ready
from later_django.db.retained_log import LogStore
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    HeadsStored,
    HeadSuccesses,
    LimitedClaim,
    LimitedClaimRequest,
    LogAppend,
    PartitionClaim,
    PartitionClaimRequest,
    PartitionHead,
    SuccessBatch,
    claimed_jobs,
)
from later_django.db.sql import partitions as partitions_sql
from later_django.db.sql import postgresql as pg_sql
from later_django.db.sql.postgresql import NOTIFY_CHANNEL as NOTIFY_CHANNEL
from later_django.db.sql.postgresql import PARTITION_CHANNEL as PARTITION_CHANNEL
from later_django.db.statements import Statements, VendorSql
from later_django.queue_names import DEFAULT_QUEUE, column_value
from later_django.states import Stage
from later_django.types import ClaimedJob, NewJob, PartitionLane

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor

# OPTIONS keys Django consumes itself; the rest go to psycopg as they are.
DJANGO_ONLY_OPTIONS: Final = frozenset(
    {"isolation_level", "pool", "server_side_binding", "assume_role"}
)
CONNECT_TIMEOUT: Final = 10  # seconds, unless OPTIONS sets connect_timeout
# A wake-up count that wakes every idle worker of a queue: the most workers
# a server runs.
WAKE_EVERY_WORKER: Final = 255
COPY_CHUNK_ROWS: Final = 200  # rows of COPY text handed to psycopg at once


class PostgresJobEngine(JobEngine):
    promote_due_sql: ClassVar[str] = pg_sql.JOB_PROMOTE_DUE_SQL
    fail_descendants_sql: ClassVar[str] = pg_sql.JOB_FAIL_DESCENDANTS_SQL
    revive_descendants_sql: ClassVar[str] = pg_sql.JOB_REVIVE_DESCENDANTS_SQL
    revive_keyless_descendants_sql: ClassVar[str] = pg_sql.JOB_REVIVE_KEYLESS_DESCENDANTS_SQL

    def __init__(self, sql: Statements) -> None:
        super().__init__(sql)
        self._claim_sql_by_limit: dict[int, str] = {}

    # -- enqueue ----------------------------------------------------------------------
    # Inserts run straight on the psycopg connection under Django's (the same
    # session and transaction), past Django's cursor, keeping its error
    # wrapping and query log.

    def job_insert_one(self, db: BaseDatabaseWrapper, job: NewJob) -> str:
        # Bound on the server and prepared, instead of SQL text formatted in
        # Python and planned anew for every job.
        ready(db)
        template, params = insert_one(job)
        insert = self._sql(template)
        started = time.monotonic()
        with db.wrap_database_errors:
            stage = _execute_prepared(db.connection, insert, params)
        log_query(db, insert, started)
        return str(stage)

    def job_insert_many(
        self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob], *, queued: bool = False
    ) -> None:
        # One COPY streams every row, in COPY's text format.
        ready(db)
        started = time.monotonic()
        rows = 0
        copy_sql = pg_sql.JOB_COPY_QUEUED_SQL if queued else pg_sql.JOB_COPY_SQL
        with db.wrap_database_errors:
            with db.connection.cursor() as cursor, cursor.copy(copy_sql) as copy:
                for chunk, count in _copy_text(jobs, COPY_CHUNK_ROWS, queued=queued):
                    copy.write(chunk)
                    rows += count
        log_query(db, f"{copy_sql} -- {rows} rows", started)

    # -- the worker's hot path ----------------------------------------------------------
    # The worker runs these on its own asyncio connection, prepared once per
    # connection: their text never changes, so the server plans them once
    # instead of on every batch. The same statements run on a Django cursor
    # (job_claim, job_complete_many) for callers in a transaction of their own.

    def _claim_sql(self, request: ClaimRequest) -> str:
        """The claim of ``request.limit`` jobs of its queue: the LIMIT is in
        the text (see sql/postgresql.py)."""
        limit = request.limit
        claim = self._claim_sql_by_limit.get(limit)
        if claim is None:
            claim = self._sql(pg_sql.JOB_CLAIM_SQL, limit=str(int(limit)))
            self._claim_sql_by_limit[limit] = claim
        return claim

    def job_claim(self, cursor: CursorWrapper, request: ClaimRequest) -> list[ClaimedJob]:
        cursor.execute(self._claim_sql(request), _claim_params(request))
        return claimed_jobs(cursor.fetchall())

    async def ajob_claim(self, cursor: AsyncCursor[Any], request: ClaimRequest) -> list[ClaimedJob]:
        await cursor.execute(self._claim_sql(request), _claim_params(request), prepare=_prepare())
        return claimed_jobs(await cursor.fetchall())

    def job_complete_many(
        self,
        cursor: CursorWrapper,
        batch: SuccessBatch,
    ) -> Completion:
        if not batch.jobs:
            return Completion(done_ids=[], released=0)
        sql, params = _complete(batch)
        cursor.execute(sql, params)
        return _completion(cursor.fetchone())

    async def ajob_complete_many(
        self,
        conn: AsyncConnection[Any],
        batch: SuccessBatch,
    ) -> Completion:
        if not batch.jobs:
            return Completion(done_ids=[], released=0)
        sql, params = _complete(batch)
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params, prepare=_prepare())
            return _completion(await cursor.fetchone())

    # -- counters -----------------------------------------------------------------------
    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        # One folder at a time per namespace; the others skip this round.
        key = zlib.crc32(f"later_stage_count:{namespace}".encode())
        cursor.execute(pg_sql.COUNTER_COMPACT_LOCK_SQL, [key])
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute(pg_sql.COUNTER_ROWS_SQL, [namespace])
        rows = int(cursor.fetchone()[0])
        if rows <= 2 * len(Stage):  # one row per stage and lane
            return 0
        cursor.execute(pg_sql.COUNTER_COMPACT_SQL, [namespace, namespace])
        return rows


class PostgresPartitionStore(PartitionStore):
    writes_one_statement: ClassVar[bool] = True

    # -- partitions ---------------------------------------------------------------------
    # A claim and a success are one statement each: a partition job pays two
    # round trips, not a transaction of several statements each way. The
    # worker runs them on its asyncio connection (the a-prefixed twins),
    # prepared once per connection, as it does the claims of plain jobs.
    def partition_claim(
        self, cursor: CursorWrapper, request: PartitionClaimRequest
    ) -> PartitionClaim | None:
        cursor.execute(self._sql(pg_sql.PARTITION_CLAIM_SQL), _partition_claim_params(request))
        return _partition_claim(request, cursor.fetchone())

    async def apartition_claim(
        self, conn: AsyncConnection[Any], request: PartitionClaimRequest
    ) -> PartitionClaim | None:
        async with conn.cursor() as cursor:
            await cursor.execute(
                self._sql(pg_sql.PARTITION_CLAIM_SQL),
                _partition_claim_params(request),
                prepare=_prepare(),
            )
            return _partition_claim(request, await cursor.fetchone())

    def partition_complete_many(self, cursor: CursorWrapper, batch: HeadSuccesses) -> HeadsStored:
        cursor.execute(self._sql(pg_sql.PARTITION_COMPLETE_MANY_SQL), _heads_complete_params(batch))
        return _heads_stored(batch, cursor.fetchall())

    async def apartition_complete_many(
        self, conn: AsyncConnection[Any], batch: HeadSuccesses
    ) -> HeadsStored:
        async with conn.cursor() as cursor:
            await cursor.execute(
                self._sql(pg_sql.PARTITION_COMPLETE_MANY_SQL),
                _heads_complete_params(batch),
                prepare=_prepare(),
            )
            return _heads_stored(batch, await cursor.fetchall())

    async def apartition_heads(
        self, conn: AsyncConnection[Any], *, namespace: str
    ) -> list[PartitionHead]:
        async with conn.cursor() as cursor:
            sql = self._sql(partitions_sql.PARTITION_HEADS_SQL)
            await cursor.execute(sql, [namespace], prepare=_prepare())
            return partition_heads(await cursor.fetchall())


def _partition_claim_params(request: PartitionClaimRequest) -> list[Any]:
    lane = request.lane
    key: list[Any] = [lane.namespace, lane.topic, lane.partition]
    return [
        *key,
        request.owner,
        request.partition_lease_ms,
        request.server_ttl_ms,
        request.owner,
        request.job_lease_ms,
        *key,
    ]


def _partition_claim(request: PartitionClaimRequest, row: Any) -> PartitionClaim | None:
    if row is None:
        return None
    epoch, lane = int(row[0]), request.lane
    if row[1] is None:
        return PartitionClaim(epoch, None)
    (job,) = claimed_jobs([row[1:]])
    return PartitionClaim(epoch, job._replace(lane=lane._replace(epoch=epoch)))


def _heads_complete_params(batch: HeadSuccesses) -> list[Any]:
    lanes = [_lane_of(job) for job in batch.heads]
    return [
        [lane.topic for lane in lanes],
        [lane.partition for lane in lanes],
        [lane.epoch for lane in lanes],
        [job.id for job in batch.heads],
        [job.attempts for job in batch.heads],
        list(batch.chain),
        lanes[0].namespace,
        batch.owner,
        batch.owner,
        batch.retention_ms,
        batch.owner,
        batch.job_lease_ms,
    ]


def _heads_stored(batch: HeadSuccesses, rows: list[Any]) -> HeadsStored:
    """One row per next head claimed, or one without (its topic NULL)."""
    lanes = {(lane.topic, lane.partition): lane for lane in map(_lane_of, batch.heads)}
    claimed = [row for row in rows if row[2] is not None]
    next_heads = [
        job._replace(lane=lanes[(str(row[2]), int(row[3]))])
        for row, job in zip(claimed, claimed_jobs([row[4:] for row in claimed]), strict=True)
    ]
    return HeadsStored(list(rows[0][0]), int(rows[0][1]), next_heads)


def _lane_of(job: ClaimedJob) -> PartitionLane:
    assert job.lane is not None, "a partition head has a lane"
    return job.lane


class PostgresLogStore(LogStore):
    # Records an append writes in one statement: 4 parameters each keeps the
    # statement far below PostgreSQL's 65,535 parameters, and its text (made
    # per call) short. Larger appends take the form of a statement per step.
    ONE_STATEMENT_RECORDS: ClassVar[int] = 1000

    def log_append_is_one_statement(self, count: int) -> bool:
        return count <= self.ONE_STATEMENT_RECORDS

    def log_append(self, cursor: CursorWrapper, append: LogAppend) -> dict[int, int] | None:
        if not self.log_append_is_one_statement(append.count):
            return super().log_append(cursor, append)
        wanted: list[Any] = []
        given: list[Any] = []
        for partition, records in append.groups:
            wanted += [partition, len(records)]
            for index, (key, value) in enumerate(records):
                given += [partition, index, key, value]
        sql = self._sql(
            pg_sql.LOG_APPEND_SQL,
            wanted=", ".join([pg_sql.LOG_APPEND_WANTED] * len(append.groups)),
            records=", ".join([pg_sql.LOG_APPEND_RECORD] * append.count),
        )
        topic = [append.namespace, append.topic]
        params = [*wanted, *topic, append.partitions, *given, *topic]
        # Bound on the server and prepared, like an enqueue's insert: a
        # single append's text never changes, so it is planned once.
        db = cursor.db
        ready(db)
        started = time.monotonic()
        with db.wrap_database_errors:
            rows = _fetch_prepared(db.connection, sql, params)
        log_query(db, sql, started)
        return {int(part): int(first) for part, first in rows} or None


class PostgresLimitStore(LimitStore):
    claim_lock_sql: ClassVar[str | None] = pg_sql.CLAIM_KEYED_LOCK_SQL

    def _claim_statement(
        self, request: ClaimRequest, *, keyed: bool, scan: int
    ) -> tuple[str, list[Any]]:
        # The sizes in the text, as the worker's plain claim has them (see
        # sql/postgresql.py): one prepared statement per size.
        limit = str(int(request.limit))
        if not keyed:
            return self._sql(pg_sql.JOB_CLAIM_SQL, limit=limit), _claim_params(request)
        sql = self._sql(pg_sql.JOB_CLAIM_KEYED_SQL, limit=limit, scan=str(scan))
        return sql, [request.namespace, *_claim_params(request)]

    async def aclaim_limited(
        self, conn: AsyncConnection[Any], request: LimitedClaimRequest
    ) -> LimitedClaim:
        prepare = _prepare()
        steps = self._claim_steps(request)
        rows: Any = None
        async with conn.transaction(), conn.cursor() as cursor:
            try:
                while True:
                    sql, params = steps.send(rows)
                    await cursor.execute(sql, params, prepare=prepare)
                    rows = await cursor.fetchall()
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]  # the generator's LimitedClaim


class PostgresDialect(Dialect):
    vendor: ClassVar[str] = "postgresql"
    supports_listen: ClassVar[bool] = True
    supports_async_connection: ClassVar[bool] = True
    vendor_sql: ClassVar[VendorSql] = VendorSql(
        now=pg_sql.NOW_SQL,
        skip_locked=pg_sql.SKIP_LOCKED,
        share_lock=pg_sql.SHARE_LOCK,
        for_update="FOR UPDATE",
    )
    job_engine: ClassVar[type[JobEngine]] = PostgresJobEngine
    partition_store: ClassVar[type[PartitionStore]] = PostgresPartitionStore
    log_store: ClassVar[type[LogStore]] = PostgresLogStore
    limit_store: ClassVar[type[LimitStore]] = PostgresLimitStore

    # -- schema -------------------------------------------------------------------
    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        cursor.execute(pg_sql.INSTALLED_OBJECTS_SQL)
        return {row[0] for row in cursor.fetchall()}

    def database_exists(self, db: BaseDatabaseWrapper) -> bool:
        # Connecting never creates a database: a missing one fails to connect.
        return True

    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        cursor.execute(pg_sql.MISSING_TABLES_SQL, [list(TABLES)])
        return [row[0] for row in cursor.fetchall()]

    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        # Said by the error itself: after it, a transaction takes no query.
        return sqlstate(exc) == UNDEFINED_TABLE

    def journal_wal(self, cursor: CursorWrapper) -> bool:
        return False  # the write-ahead log is not a setting of a database

    def database_size(self, cursor: CursorWrapper) -> int:
        cursor.execute(pg_sql.DATABASE_SIZE_SQL)
        return int(cursor.fetchone()[0])

    def announce_ready(self, cursor: CursorWrapper, *, namespace: str, queue: str) -> None:
        # As the counter triggers announce jobs that became ready (migration
        # 0014), with the most workers a server runs: every idle one wakes.
        said = namespace if queue == DEFAULT_QUEUE else f"{namespace}\x1e{queue}"
        cursor.execute(pg_sql.NOTIFY_SQL, [NOTIFY_CHANNEL, f"{said}\x1f{WAKE_EVERY_WORKER}"])


def _claim_params(request: ClaimRequest) -> list[Any]:
    return [*queue_filter_params(request), request.owner, request.lease_ms]


def _complete(batch: SuccessBatch) -> tuple[str, list[Any]]:
    """The completion of ``batch`` and its parameters: later_complete_many's
    arguments are the batch as two arrays, so the call's text never changes;
    a batch with task jobs writes their results in the same statement."""
    jobs = batch.jobs
    params: list[Any] = [
        [job_id for job_id, _ in jobs],
        [attempts for _, attempts in jobs],
        batch.owner,
        batch.retention_ms,
    ]
    if not batch.results:
        return pg_sql.JOB_COMPLETE_MANY_SQL, params
    rows = [end.row(batch.owner) for end in batch.results]
    params += [list(column) for column in zip(*rows, strict=True)]
    return pg_sql.JOB_COMPLETE_MANY_WITH_RESULTS_SQL, params


def _completion(row: Any) -> Completion:
    assert row is not None
    return Completion(done_ids=[str(job_id) for job_id in row[0]], released=int(row[1]))


def _copy_text(
    jobs: Iterable[NewJob], chunk_rows: int, *, queued: bool = False
) -> Iterator[tuple[str, int]]:
    """``jobs`` as lines of COPY's text format: (text, lines), ``chunk_rows``
    lines a chunk; each line ends with the job's queue when ``queued``.

    The jobs of one batch differ only in id and payload, so everything else
    of a line is escaped once per batch and reused: a line costs one f-string
    instead of thirteen values converted one by one."""
    shared: dict[tuple[Any, ...], tuple[str, str]] = {}
    lines: list[str] = []
    for job in jobs:
        key = (job.namespace, job.type_name, job.priority, job.retry_policy, job.queue)
        parts = shared.get(key)
        if parts is None:
            head = [_copy_value(job.namespace), _copy_value(job.type_name)]
            tail = ["enqueued", str(job.priority), "0", _copy_value(job.retry_policy)]
            if queued:
                tail.append(_copy_value(column_value(job.queue)))
            parts = shared[key] = ("\t".join(head), "\t".join(tail))
        # ids are ULIDs and payloads hex: neither needs escaping.
        lines.append(f"{job.id}\t{parts[0]}\t\\\\x{job.payload.hex()}\t{parts[1]}\n")
        if len(lines) == chunk_rows:
            yield "".join(lines), len(lines)
            lines.clear()
    if lines:
        yield "".join(lines), len(lines)


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_value(value: object) -> str:
    """One value in COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    return str(value).translate(_COPY_ESCAPES)


def _execute_prepared(raw: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> Any:
    """Run ``sql`` on a Django connection's psycopg connection, bound on the
    server and, when LATER["PREPARED_STATEMENTS"] allows, prepared; return
    the first column of its first row (None without a row)."""
    rows = _fetch_prepared(raw, sql, params, first_only=True)
    return rows[0][0] if rows else None


def _fetch_prepared(
    raw: psycopg.Connection[Any], sql: str, params: Sequence[Any], *, first_only: bool = False
) -> list[tuple[Any, ...]]:
    """_execute_prepared's statement, returning its rows (the first alone
    with ``first_only``).

    Django opens its connections with prepare_threshold=None, which turns
    psycopg's statement cache off; it is switched on for this call only, so
    no statement of the application's own is ever prepared by it."""
    prepare = _prepare()
    threshold = raw.prepare_threshold
    if prepare and threshold is None:
        raw.prepare_threshold = 0
    try:
        with psycopg.Cursor(raw) as cursor:
            cursor.execute(sql, params, prepare=prepare)
            if first_only:
                row = cursor.fetchone()
                return [] if row is None else [row]
            return cursor.fetchall()
    finally:
        raw.prepare_threshold = threshold


def _prepare() -> bool:
    """Whether later's statements are prepared (LATER["PREPARED_STATEMENTS"])."""
    return bool(conf.PREPARED_STATEMENTS)


def connect_kwargs(alias: str) -> dict[str, Any]:
    """psycopg.connect() arguments for a connection of later's own to ``alias``
    (LISTEN, the worker's claims and completions), from its Django settings."""
    settings = connections[alias].settings_dict
    options = {k: v for k, v in settings.get("OPTIONS", {}).items() if k not in DJANGO_ONLY_OPTIONS}
    kwargs = {
        "dbname": settings.get("NAME") or "postgres",
        "user": settings.get("USER") or None,
        "password": settings.get("PASSWORD") or None,
        "host": settings.get("HOST") or None,
        "port": settings.get("PORT") or None,
        "connect_timeout": CONNECT_TIMEOUT,
        **options,
    }
    return {k: v for k, v in kwargs.items() if v is not None}
