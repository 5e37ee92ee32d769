"""PostgreSQL: SKIP LOCKED claims, statement-level counter triggers, NOTIFY.

This module holds the dialect, its enqueue (straight on the psycopg
connection under Django's), its upkeep and its retained log. The worker's
claims and completions, which run on an asyncio connection of its own
(db/sessions.py), are db/postgresql_hot.py's. Whether a statement is
prepared is its caller's to say (``prepare``): db/ reads no settings.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, Final

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.base import TABLES, Dialect
from later_django.db.enqueue import EnqueueStore, insert_statement
from later_django.db.errors import UNDEFINED_TABLE, sqlstate
from later_django.db.hot import HotStore
from later_django.db.limits import LimitStore
from later_django.db.partitions import PartitionStore
from later_django.db.past_django import log_query, ready
from later_django.db.postgresql_hot import PostgresHot, PostgresLimitStore, PostgresPartitionStore
from later_django.db.retained_log import LogStore
from later_django.db.rows import LogAppend
from later_django.db.sql import Statement
from later_django.db.sql import database as database_sql
from later_django.db.sql import descendants as descendants_sql
from later_django.db.sql import enqueue as enqueue_sql
from later_django.db.sql import postgresql as pg_sql
from later_django.db.sql import retained_log as log_sql
from later_django.db.sql import upkeep as upkeep_sql
from later_django.db.sql.postgresql import NOTIFY_CHANNEL as NOTIFY_CHANNEL
from later_django.db.sql.postgresql import PARTITION_CHANNEL as PARTITION_CHANNEL
from later_django.db.statements import VendorSql, Walks, run
from later_django.db.upkeep import UpkeepStore
from later_django.queue_names import DEFAULT_QUEUE, column_value
from later_django.states import Stage
from later_django.types import NewJob

# OPTIONS keys Django consumes itself; the rest go to psycopg as they are.
DJANGO_ONLY_OPTIONS: Final = frozenset(
    {"isolation_level", "pool", "server_side_binding", "assume_role"}
)
CONNECT_TIMEOUT: Final = 10  # seconds, unless OPTIONS sets connect_timeout
# A wake-up count that wakes every idle worker of a queue: the most workers
# a server runs.
WAKE_EVERY_WORKER: Final = 255
COPY_CHUNK_ROWS: Final = 200  # rows of COPY text handed to psycopg at once


class PostgresEnqueue(EnqueueStore):
    # Inserts run straight on the psycopg connection under Django's (the same
    # session and transaction), past Django's cursor, keeping its error
    # wrapping and query log.

    def insert_one(self, db: BaseDatabaseWrapper, job: NewJob, *, prepare: bool) -> str:
        # Bound on the server and, with ``prepare``, prepared, instead of SQL
        # text formatted in Python and planned anew for every job.
        ready(db)
        statement, params = insert_statement(job)
        insert, values = self._sql.bind(statement, **params)
        started = time.monotonic()
        with db.wrap_database_errors:
            stage = _execute_prepared(db.connection, insert, values, prepare=prepare)
        log_query(db, insert, started)
        return str(stage)

    def insert_many(
        self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob], *, queued: bool = False
    ) -> None:
        # One COPY streams every row, in COPY's text format.
        ready(db)
        started = time.monotonic()
        rows = 0
        if queued:
            copy_sql, _ = self._sql.bind(enqueue_sql.COPY_QUEUED_PG)
        else:
            copy_sql, _ = self._sql.bind(enqueue_sql.COPY_PG)
        with db.wrap_database_errors:
            with db.connection.cursor() as cursor, cursor.copy(copy_sql) as copy:
                for chunk, count in _copy_text(jobs, COPY_CHUNK_ROWS, queued=queued):
                    copy.write(chunk)
                    rows += count
        log_query(db, f"{copy_sql} -- {rows} rows", started)


class PostgresUpkeep(UpkeepStore):
    promote_due_statement: ClassVar[Statement] = upkeep_sql.PROMOTE_DUE_PG

    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        # One folder at a time per namespace; the others skip this round.
        key = zlib.crc32(f"later_stage_count:{namespace}".encode())
        self._run(cursor, upkeep_sql.COUNTER_FOLD_LOCK_PG, key=key)
        if not cursor.fetchone()[0]:
            return 0
        self._run(cursor, upkeep_sql.COUNTER_ROWS_PG, namespace=namespace)
        rows = int(cursor.fetchone()[0])
        if rows <= 2 * len(Stage):  # one row per stage and lane
            return 0
        self._run(cursor, upkeep_sql.COUNTER_FOLD_PG, namespace=namespace)
        return rows


class PostgresLogStore(LogStore):
    # Records an append writes in one statement: 4 parameters each keeps the
    # statement far below PostgreSQL's 65,535 parameters, and its text (made
    # per call) short. Larger appends take the form of a statement per step.
    ONE_STATEMENT_RECORDS: ClassVar[int] = 1000

    def log_append_is_one_statement(self, count: int) -> bool:
        return count <= self.ONE_STATEMENT_RECORDS

    def log_append(
        self, cursor: CursorWrapper, append: LogAppend, *, prepare: bool
    ) -> dict[int, int] | None:
        if not self.log_append_is_one_statement(append.count):
            return super().log_append(cursor, append, prepare=prepare)
        wanted = [(partition, len(records)) for partition, records in append.groups]
        given = [
            (partition, index, key, value)
            for partition, records in append.groups
            for index, (key, value) in enumerate(records)
        ]
        sql, params = self._sql.bind(
            log_sql.APPEND_PG,
            wanted=wanted,
            namespace=append.namespace,
            topic=append.topic,
            partitions=append.partitions,
            records=given,
        )
        # Bound on the server and prepared, like an enqueue's insert: a
        # single append's text never changes, so it is planned once.
        db = cursor.db
        ready(db)
        started = time.monotonic()
        with db.wrap_database_errors:
            rows = _fetch_prepared(db.connection, sql, params, prepare=prepare)
        log_query(db, sql, started)
        return {int(part): int(first) for part, first in rows} or None


class PostgresDialect(Dialect):
    vendor: ClassVar[str] = "postgresql"
    supports_listen: ClassVar[bool] = True
    supports_async_connection: ClassVar[bool] = True
    vendor_sql: ClassVar[VendorSql] = VendorSql(
        now=pg_sql.NOW_SQL,
        walks=Walks(
            fail=descendants_sql.FAIL_DESCENDANTS_PG,
            revive=descendants_sql.REVIVE_DESCENDANTS_PG,
            revive_keyless=descendants_sql.REVIVE_KEYLESS_DESCENDANTS_PG,
        ),
        skip_locked=pg_sql.SKIP_LOCKED,
        share_lock=pg_sql.SHARE_LOCK,
        for_update="FOR UPDATE",
    )
    enqueue_store: ClassVar[type[EnqueueStore]] = PostgresEnqueue
    hot_store: ClassVar[type[HotStore]] = PostgresHot
    upkeep_store: ClassVar[type[UpkeepStore]] = PostgresUpkeep
    partition_store: ClassVar[type[PartitionStore]] = PostgresPartitionStore
    log_store: ClassVar[type[LogStore]] = PostgresLogStore
    limit_store: ClassVar[type[LimitStore]] = PostgresLimitStore

    # -- schema -------------------------------------------------------------------
    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        run(cursor, self._sql, database_sql.INSTALLED_OBJECTS_PG)
        return {row[0] for row in cursor.fetchall()}

    def database_exists(self, db: BaseDatabaseWrapper) -> bool:
        # Connecting never creates a database: a missing one fails to connect.
        return True

    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        run(cursor, self._sql, database_sql.MISSING_TABLES_PG, tables=list(TABLES))
        return [row[0] for row in cursor.fetchall()]

    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        # Said by the error itself: after it, a transaction takes no query.
        return sqlstate(exc) == UNDEFINED_TABLE

    def journal_wal(self, cursor: CursorWrapper) -> bool:
        return False  # the write-ahead log is not a setting of a database

    def database_size(self, cursor: CursorWrapper) -> int:
        run(cursor, self._sql, database_sql.DATABASE_SIZE_PG)
        return int(cursor.fetchone()[0])

    def announce_ready(self, cursor: CursorWrapper, *, namespace: str, queue: str) -> None:
        # As the counter triggers announce jobs that became ready (migration
        # 0014), with the most workers a server runs: every idle one wakes.
        said = namespace if queue == DEFAULT_QUEUE else f"{namespace}\x1e{queue}"
        payload = f"{said}\x1f{WAKE_EVERY_WORKER}"
        run(cursor, self._sql, database_sql.NOTIFY_PG, channel=NOTIFY_CHANNEL, payload=payload)


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


def _execute_prepared(
    raw: psycopg.Connection[Any], sql: str, params: Sequence[Any], *, prepare: bool
) -> Any:
    """Run ``sql`` on a Django connection's psycopg connection, bound on the
    server and, when ``prepare`` (its caller's LATER["PREPARED_STATEMENTS"]),
    prepared; return the first column of its first row (None without a row)."""
    rows = _fetch_prepared(raw, sql, params, prepare=prepare, first_only=True)
    return rows[0][0] if rows else None


def _fetch_prepared(
    raw: psycopg.Connection[Any],
    sql: str,
    params: Sequence[Any],
    *,
    prepare: bool,
    first_only: bool = False,
) -> list[tuple[Any, ...]]:
    """_execute_prepared's statement, returning its rows (the first alone
    with ``first_only``).

    Django opens its connections with prepare_threshold=None, which turns
    psycopg's statement cache off; it is switched on for this call only, so
    no statement of the application's own is ever prepared by it."""
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
