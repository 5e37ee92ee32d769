"""PostgreSQL: SKIP LOCKED claims, statement-level counter triggers, NOTIFY."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.clock import history_entry
from later_django.conf import conf
from later_django.db.base import (
    CLAIM_SET,
    INSERT_COLUMNS,
    INSERT_ROW,
    Dialect,
    claimed_jobs,
    insert_row,
)
from later_django.states import Stage
from later_django.types import ClaimedJob, NewJob

if TYPE_CHECKING:
    from psycopg import AsyncCursor

NOTIFY_CHANNEL: Final = "later"
# OPTIONS keys Django consumes itself; the rest go to psycopg as they are.
DJANGO_ONLY_OPTIONS: Final = frozenset(
    {"isolation_level", "pool", "server_side_binding", "assume_role"}
)
CONNECT_TIMEOUT: Final = 10  # seconds, unless OPTIONS sets connect_timeout
COPY_CHUNK_ROWS: Final = 200  # rows of COPY text handed to psycopg at once

JOB_INSERT_SQL: Final = f"INSERT INTO later_job ({INSERT_COLUMNS}) VALUES {INSERT_ROW}"
JOB_COPY_SQL: Final = f"COPY later_job ({INSERT_COLUMNS}) FROM STDIN"

JOB_CLAIM_SQL: Final = f"""
WITH picked AS (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage = 'enqueued'
    ORDER BY priority DESC, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE later_job j SET {CLAIM_SET}
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.type_name, j.payload, j.attempts, j.retry_policy, j.created_ms,
    j.run_at_ms
"""

# Statement-level triggers see every changed row at once through transition
# tables, so a batch of 500 inserts adds one counter row per stage, not 500.
# Counter rows are only ever inserted here (never updated), so concurrent
# writers never wait on each other; maintenance folds them together.
TRIGGER_FUNCTIONS_SQL: Final = f"""
CREATE OR REPLACE FUNCTION later_job_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, n)
        SELECT namespace, stage, count(*) FROM new_rows GROUP BY namespace, stage;
    FOR ns IN SELECT DISTINCT namespace FROM new_rows WHERE stage = 'enqueued' LOOP
        PERFORM pg_notify('{NOTIFY_CHANNEL}', ns);
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION later_job_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, n)
        SELECT namespace, stage, sum(d) FROM (
            SELECT o.namespace, o.stage, -1 AS d
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
            UNION ALL
            SELECT n.namespace, n.stage, 1
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
        ) changes GROUP BY namespace, stage;
    FOR ns IN SELECT DISTINCT n.namespace FROM old_rows o JOIN new_rows n ON n.id = o.id
            WHERE n.stage = 'enqueued' AND o.stage <> 'enqueued' LOOP
        PERFORM pg_notify('{NOTIFY_CHANNEL}', ns);
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION later_job_after_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO later_stage_count (namespace, stage, n)
        SELECT namespace, stage, -count(*) FROM old_rows GROUP BY namespace, stage;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION later_job_after_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM later_stage_count;
    RETURN NULL;
END $$;
"""

TRIGGERS: Final = {
    "later_job_after_insert": "AFTER INSERT ON later_job REFERENCING NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_insert()",
    "later_job_after_update": "AFTER UPDATE ON later_job REFERENCING OLD TABLE AS old_rows "
    "NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_update()",
    "later_job_after_delete": "AFTER DELETE ON later_job REFERENCING OLD TABLE AS old_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_delete()",
    "later_job_after_truncate": "AFTER TRUNCATE ON later_job "
    "FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_truncate()",
}

# Completion and release of continuations in one statement, so a batch of
# successes costs one round trip in autocommit instead of a transaction's four.
# The batch travels as two arrays, so the text is the same for every batch
# size and the worker runs it as one prepared statement.
JOB_COMPLETE_MANY_SQL: Final = """
WITH done AS (
    UPDATE later_job j SET stage = 'success', changed_ms = %s, finished_ms = %s,
        expires_ms = %s, lease_owner = NULL, lease_expires_ms = NULL,
        history = j.history || %s
    FROM unnest(%s::text[], %s::int[]) AS v (id, attempts)
    WHERE j.id = v.id AND j.attempts = v.attempts AND j.lease_owner = %s
    RETURNING j.id
), released AS (
    UPDATE later_job SET stage = 'enqueued', changed_ms = %s, run_at_ms = %s,
        history = history || %s
    WHERE parent_id IN (SELECT id FROM done) AND stage = 'waiting'
    RETURNING 1
)
SELECT id, (SELECT count(*) FROM released) FROM done
"""

COUNTER_COMPACT_SQL: Final = """
WITH folded AS (
    DELETE FROM later_stage_count WHERE namespace = %s RETURNING stage, n
)
INSERT INTO later_stage_count (namespace, stage, n)
SELECT %s, stage, SUM(n) FROM folded GROUP BY stage
"""


class PostgresDialect(Dialect):
    vendor: ClassVar[str] = "postgresql"
    supports_skip_locked: ClassVar[bool] = True
    supports_listen: ClassVar[bool] = True
    atomic_complete_many: ClassVar[bool] = True
    skip_locked: ClassVar[str] = "FOR UPDATE SKIP LOCKED"
    # Holds the parent row while a continuation is inserted, so the parent's
    # finish (which releases or fails its children) waits for this insert.
    parent_lock: ClassVar[str] = "FOR SHARE"
    trigger_names: ClassVar[frozenset[str]] = frozenset(TRIGGERS)
    supports_async_connection: ClassVar[bool] = True

    def install(self, cursor: CursorWrapper) -> None:
        cursor.execute(TRIGGER_FUNCTIONS_SQL)
        for name, body in TRIGGERS.items():
            cursor.execute(f"CREATE OR REPLACE TRIGGER {name} {body}")

    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'later_job'::regclass "
            "AND NOT tgisinternal"
        )
        return {row[0] for row in cursor.fetchall()}

    # Both run straight on the psycopg connection under Django's (the same
    # session and transaction), past Django's cursor, keeping its error
    # wrapping and query log.
    def job_insert_one(self, db: BaseDatabaseWrapper, job: NewJob) -> None:
        # Bound on the server and prepared, instead of SQL text formatted in
        # Python and planned anew for every job.
        _ready(db)
        started = time.monotonic()
        with db.wrap_database_errors:
            _execute_prepared(db.connection, JOB_INSERT_SQL, insert_row(job))
        _log_query(db, JOB_INSERT_SQL, started)

    def job_insert_many(self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob]) -> None:
        # One COPY streams every row, in COPY's text format.
        _ready(db)
        started = time.monotonic()
        rows = 0
        with db.wrap_database_errors:
            with db.connection.cursor() as cursor, cursor.copy(JOB_COPY_SQL) as copy:
                for chunk, count in _copy_text(jobs, COPY_CHUNK_ROWS):
                    copy.write(chunk)
                    rows += count
        _log_query(db, f"{JOB_COPY_SQL} -- {rows} rows", started)

    def job_claim(
        self,
        cursor: CursorWrapper,
        *,
        namespace: str,
        owner: str,
        limit: int,
        now_ms: int,
        lease_until_ms: int,
    ) -> list[ClaimedJob]:
        cursor.execute(
            JOB_CLAIM_SQL, _claim_params(namespace, owner, limit, now_ms, lease_until_ms)
        )
        return claimed_jobs(cursor.fetchall())

    def job_complete_many(
        self,
        cursor: CursorWrapper,
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        now_ms: int,
        expires_ms: int,
    ) -> tuple[list[str], int]:
        if not jobs:
            return [], 0
        cursor.execute(
            JOB_COMPLETE_MANY_SQL, _complete_many_params(owner, jobs, now_ms, expires_ms)
        )
        return _completed(cursor.fetchall())

    # -- the worker's own asyncio connection (see store.HotPath) ----------------
    # The same statements, prepared once per connection: their text never
    # changes, so the server plans them once instead of on every batch.
    async def ajob_claim(
        self,
        cursor: AsyncCursor[Any],
        *,
        namespace: str,
        owner: str,
        limit: int,
        now_ms: int,
        lease_until_ms: int,
    ) -> list[ClaimedJob]:
        await cursor.execute(
            JOB_CLAIM_SQL,
            _claim_params(namespace, owner, limit, now_ms, lease_until_ms),
            prepare=_prepare(),
        )
        return claimed_jobs(await cursor.fetchall())

    async def ajob_complete_many(
        self,
        cursor: AsyncCursor[Any],
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        now_ms: int,
        expires_ms: int,
    ) -> tuple[list[str], int]:
        if not jobs:
            return [], 0
        await cursor.execute(
            JOB_COMPLETE_MANY_SQL,
            _complete_many_params(owner, jobs, now_ms, expires_ms),
            prepare=_prepare(),
        )
        return _completed(await cursor.fetchall())

    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        # One folder at a time per namespace; the others skip this round.
        key = zlib.crc32(f"later_stage_count:{namespace}".encode())
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [key])
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute("SELECT count(*) FROM later_stage_count WHERE namespace = %s", [namespace])
        rows = int(cursor.fetchone()[0])
        if rows <= len(Stage):
            return 0
        cursor.execute(COUNTER_COMPACT_SQL, [namespace, namespace])
        return rows

    def database_size(self, cursor: CursorWrapper) -> int | None:
        cursor.execute("SELECT pg_database_size(current_database())")
        return int(cursor.fetchone()[0])


def _copy_text(jobs: Iterable[NewJob], chunk_rows: int) -> Iterator[tuple[str, int]]:
    """``jobs`` as lines of COPY's text format: (text, lines), ``chunk_rows``
    lines a chunk.

    The jobs of one batch differ only in id and payload, so everything else
    of a line is escaped once per batch and reused: a line costs one f-string
    instead of thirteen values converted one by one."""
    shared: dict[tuple[Any, ...], tuple[str, str]] = {}
    lines: list[str] = []
    for job in jobs:
        key = job[1:3] + job[4:]  # every field but id (0) and payload (3)
        parts = shared.get(key)
        if parts is None:
            row = [_copy_value(value) for value in insert_row(job)]
            parts = shared[key] = ("\t".join(row[1:3]), "\t".join(row[4:]))
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


def _ready(db: BaseDatabaseWrapper) -> None:
    """What Django's cursor checks before a statement: connected, and not
    inside an atomic block broken by an earlier error."""
    db.ensure_connection()
    db.validate_no_broken_transaction()


def _execute_prepared(raw: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> None:
    """Run ``sql`` on a Django connection's psycopg connection, bound on the
    server and, when LATER["PREPARED_STATEMENTS"] allows, prepared.

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
    finally:
        raw.prepare_threshold = threshold


def _prepare() -> bool:
    """Whether later's statements are prepared (LATER["PREPARED_STATEMENTS"])."""
    return bool(conf.PREPARED_STATEMENTS)


def _claim_params(
    namespace: str, owner: str, limit: int, now_ms: int, lease_until_ms: int
) -> list[Any]:
    running = history_entry(Stage.RUNNING, now_ms)
    return [namespace, limit, now_ms, now_ms, owner, lease_until_ms, running]


def _complete_many_params(
    owner: str, jobs: Sequence[tuple[str, int]], now_ms: int, expires_ms: int
) -> list[Any]:
    return [
        now_ms,
        now_ms,
        expires_ms,
        history_entry(Stage.SUCCESS, now_ms),
        [job_id for job_id, _ in jobs],
        [attempts for _, attempts in jobs],
        owner,
        now_ms,
        now_ms,
        history_entry(Stage.ENQUEUED, now_ms),
    ]


def _completed(rows: Sequence[Sequence[Any]]) -> tuple[list[str], int]:
    """The completed ids and how many continuations they released."""
    return [str(row[0]) for row in rows], int(rows[0][1]) if rows else 0


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


def _log_query(db: BaseDatabaseWrapper, sql: str, started: float) -> None:
    """Record a statement run past Django's cursor where Django records its own
    (connection.queries, assertNumQueries), so it stays visible when debugging."""
    if db.queries_logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
