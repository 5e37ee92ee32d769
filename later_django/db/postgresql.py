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

from later_django.conf import conf
from later_django.db.base import TABLES, Dialect, claimed_jobs, insert_one_params
from later_django.db.errors import UNDEFINED_TABLE, sqlstate
from later_django.states import Stage
from later_django.types import ClaimedJob, NewJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor

NOTIFY_CHANNEL: Final = "later"
# OPTIONS keys Django consumes itself; the rest go to psycopg as they are.
DJANGO_ONLY_OPTIONS: Final = frozenset(
    {"isolation_level", "pool", "server_side_binding", "assume_role"}
)
CONNECT_TIMEOUT: Final = 10  # seconds, unless OPTIONS sets connect_timeout
COPY_CHUNK_ROWS: Final = 200  # rows of COPY text handed to psycopg at once

# The columns a COPY of ready jobs carries; the times and the history entry
# are the columns' defaults (migration 0002), the database's clock at the
# COPY's start.
COPY_COLUMNS: Final = "id, namespace, type_name, payload, stage, priority, attempts, retry_policy"
JOB_COPY_SQL: Final = f"COPY later_job ({COPY_COLUMNS}) FROM STDIN"

# The clock is read once for the whole claim (t): SKIP LOCKED never waits,
# so that is the time of the write, and one read instead of four per row.
# The LIMIT is written into the text (one prepared statement per claim size,
# at most the worker count): as a parameter, the server's generic plan
# assumes a large limit and hash-joins a scan of the whole table, so it plans
# a custom plan for every single claim instead.
JOB_CLAIM_SQL: Final = """
WITH picked AS (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage = 'enqueued'
    ORDER BY priority DESC, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), t AS MATERIALIZED (SELECT {now} AS now)
UPDATE later_job j SET stage = 'running', attempts = j.attempts + 1,
    changed_ms = GREATEST(t.now, j.changed_ms), started_ms = GREATEST(t.now, j.changed_ms),
    lease_owner = %s, lease_expires_ms = t.now + %s,
    history = j.history || 'running@' || GREATEST(t.now, j.changed_ms) || ';'
FROM picked, t WHERE j.id = picked.id
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

# Successes in bulk, then the release of their waiting continuations, in one
# function: one statement and one round trip for the worker (the batch
# travels as two arrays, so the call's text never changes and is prepared
# once). Each statement inside a plpgsql function takes a snapshot of its
# own, so the look for children, after the parents' update, sees every
# child committed until then, including one whose transaction was still open
# when the completion began; a single SQL statement would miss it. Most
# batches have no waiting child: the look is a read, and the UPDATE (and its
# statement-level counter trigger) runs only when one exists.
COMPLETE_MANY_FUNCTION_SQL: Final = """
CREATE OR REPLACE FUNCTION later_complete_many(
    p_ids text[], p_attempts int[], p_owner text, p_retention_ms bigint,
    OUT done_ids text[], OUT released bigint)
LANGUAGE plpgsql VOLATILE
-- The generic plans of these statements are the right ones (one index probe
-- per id), but their estimate of an array of unknown length is higher than a
-- custom plan's, so the server would plan them anew on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    now_ms bigint := {now};
BEGIN
    WITH done AS (
        UPDATE later_job j SET stage = 'success',
            changed_ms = GREATEST(now_ms, j.changed_ms),
            finished_ms = GREATEST(now_ms, j.changed_ms),
            expires_ms = now_ms + p_retention_ms, lease_owner = NULL,
            lease_expires_ms = NULL,
            history = j.history || 'success@' || GREATEST(now_ms, j.changed_ms) || ';'
        FROM unnest(p_ids, p_attempts) AS v (id, attempts)
        WHERE j.id = v.id AND j.attempts = v.attempts AND j.lease_owner = p_owner
        RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO done_ids FROM done;
    released := 0;
    IF cardinality(done_ids) > 0 AND EXISTS (
        SELECT 1 FROM later_job WHERE parent_id = ANY(done_ids) AND stage = 'waiting'
    ) THEN
        now_ms := {now};
        UPDATE later_job SET stage = 'enqueued',
            changed_ms = GREATEST(now_ms, changed_ms), run_at_ms = now_ms,
            history = history || 'enqueued@' || GREATEST(now_ms, changed_ms) || ';'
        WHERE parent_id = ANY(done_ids) AND stage = 'waiting';
        GET DIAGNOSTICS released = ROW_COUNT;
    END IF;
END $$;
"""

JOB_COMPLETE_MANY_SQL: Final = "SELECT done_ids, released FROM later_complete_many(%s, %s, %s, %s)"

COUNTER_COMPACT_SQL: Final = """
WITH folded AS (
    DELETE FROM later_stage_count WHERE namespace = %s RETURNING stage, n
)
INSERT INTO later_stage_count (namespace, stage, n)
SELECT %s, stage, SUM(n) FROM folded GROUP BY stage
"""


# to_regclass follows the search_path, as the unqualified names of every
# other statement do; NULL is a table it cannot find.
MISSING_TABLES_SQL: Final = """
SELECT t.name FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, n)
WHERE to_regclass(t.name) IS NULL ORDER BY t.n
"""


class PostgresDialect(Dialect):
    vendor: ClassVar[str] = "postgresql"
    supports_listen: ClassVar[bool] = True
    # clock_timestamp(), not now(): the time of the write itself, not of the
    # start of the transaction or of a statement that waited for a lock.
    # date_part() is double precision: far cheaper than extract()'s numeric,
    # and exact to the millisecond for any date a job can have.
    now_sql: ClassVar[str] = "(date_part('epoch', clock_timestamp()) * 1000)::bigint"
    # statement_timestamp() is stable: the planner can search an index with it.
    cutoff_sql: ClassVar[str] = "(date_part('epoch', statement_timestamp()) * 1000)::bigint"
    skip_locked: ClassVar[str] = "FOR UPDATE SKIP LOCKED"
    share_lock: ClassVar[str] = "FOR SHARE OF p"
    trigger_names: ClassVar[frozenset[str]] = frozenset({*TRIGGERS, "later_complete_many"})
    supports_async_connection: ClassVar[bool] = True

    def install(self, cursor: CursorWrapper) -> None:
        cursor.execute(TRIGGER_FUNCTIONS_SQL)
        cursor.execute(self.complete_many_function_sql)
        for name, body in TRIGGERS.items():
            cursor.execute(f"CREATE OR REPLACE TRIGGER {name} {body}")

    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'later_job'::regclass "
            "AND NOT tgisinternal "
            "UNION ALL SELECT proname FROM pg_proc WHERE proname = 'later_complete_many'"
        )
        return {row[0] for row in cursor.fetchall()}

    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        cursor.execute(MISSING_TABLES_SQL, [list(TABLES)])
        return [row[0] for row in cursor.fetchall()]

    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        # Said by the error itself: after it, a transaction takes no query.
        return sqlstate(exc) == UNDEFINED_TABLE

    def __init__(self) -> None:
        super().__init__()
        self.insert_one_sql = self.insert_sql + " RETURNING stage"
        self._claim_sql = self.render(JOB_CLAIM_SQL)
        self._claim_sql_by_limit: dict[int, str] = {}
        self.complete_many_function_sql = self.render(COMPLETE_MANY_FUNCTION_SQL)

    # Inserts run straight on the psycopg connection under Django's (the same
    # session and transaction), past Django's cursor, keeping its error
    # wrapping and query log.

    def job_insert_one(self, db: BaseDatabaseWrapper, job: NewJob) -> str:
        # Bound on the server and prepared, instead of SQL text formatted in
        # Python and planned anew for every job.
        _ready(db)
        started = time.monotonic()
        with db.wrap_database_errors:
            stage = _execute_prepared(db.connection, self.insert_one_sql, insert_one_params(job))
        _log_query(db, self.insert_one_sql, started)
        return str(stage)

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

    def claim_sql(self, limit: int) -> str:
        sql = self._claim_sql_by_limit.get(limit)
        if sql is None:
            sql = self._claim_sql.replace("{limit}", str(int(limit)))
            self._claim_sql_by_limit[limit] = sql
        return sql

    # -- the worker's own asyncio connection (see db/sessions.py) ---------------
    # Statements prepared once per connection: their text never changes, so
    # the server plans them once instead of on every batch.
    async def ajob_claim(
        self, cursor: AsyncCursor[Any], *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        await cursor.execute(
            self.claim_sql(limit), [namespace, owner, lease_ms], prepare=_prepare()
        )
        return claimed_jobs(await cursor.fetchall())

    async def ajob_complete_many(
        self,
        conn: AsyncConnection[Any],
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        retention_ms: int,
    ) -> tuple[list[str], int]:
        if not jobs:
            return [], 0
        async with conn.cursor() as cursor:
            await cursor.execute(
                JOB_COMPLETE_MANY_SQL,
                [
                    [job_id for job_id, _ in jobs],
                    [attempts for _, attempts in jobs],
                    owner,
                    retention_ms,
                ],
                prepare=_prepare(),
            )
            row = await cursor.fetchone()
        assert row is not None
        return [str(job_id) for job_id in row[0]], int(row[1])

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


def _copy_text(jobs: Iterable[NewJob], chunk_rows: int) -> Iterator[tuple[str, int]]:
    """``jobs`` as lines of COPY's text format: (text, lines), ``chunk_rows``
    lines a chunk.

    The jobs of one batch differ only in id and payload, so everything else
    of a line is escaped once per batch and reused: a line costs one f-string
    instead of thirteen values converted one by one."""
    shared: dict[tuple[Any, ...], tuple[str, str]] = {}
    lines: list[str] = []
    for job in jobs:
        key = (job.namespace, job.type_name, job.priority, job.retry_policy)
        parts = shared.get(key)
        if parts is None:
            head = [_copy_value(job.namespace), _copy_value(job.type_name)]
            tail = ["enqueued", str(job.priority), "0", _copy_value(job.retry_policy)]
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


def _ready(db: BaseDatabaseWrapper) -> None:
    """What Django's cursor checks before a statement: connected, and not
    inside an atomic block broken by an earlier error."""
    db.ensure_connection()
    db.validate_no_broken_transaction()


def _execute_prepared(raw: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> Any:
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
            row = cursor.fetchone()
            return None if row is None else row[0]
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


def _log_query(db: BaseDatabaseWrapper, sql: str, started: float) -> None:
    """Record a statement run past Django's cursor where Django records its own
    (connection.queries, assertNumQueries), so it stays visible when debugging."""
    if db.queries_logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
