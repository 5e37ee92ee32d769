"""SQLite: one writer at a time, so a single UPDATE ... RETURNING claims atomically."""

from __future__ import annotations

import os
import sqlite3
from typing import ClassVar, Final
from urllib.parse import unquote, urlsplit

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.base import CLAIM_RETURNING, CLAIM_SET, TABLES, Dialect, claimed_jobs
from later_django.db.errors import SQLITE_ERROR, sqlite_code
from later_django.types import ClaimedJob

# A write statement takes SQLite's write lock before it reads, so the
# sub-select and the update see the same rows; no other claim interleaves.
JOB_CLAIM_SQL: Final = f"""
UPDATE later_job SET {CLAIM_SET}
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage = 'enqueued'
    ORDER BY priority DESC, id
    LIMIT %s)
RETURNING {CLAIM_RETURNING}
"""

# Row-level triggers upserting one row per stage: SQLite has a single writer,
# so this row is never contended.
TRIGGERS: Final = {
    "later_job_count_insert": """
        CREATE TRIGGER IF NOT EXISTS later_job_count_insert AFTER INSERT ON later_job
        BEGIN
            INSERT INTO later_stage_count (namespace, stage, n)
            VALUES (NEW.namespace, NEW.stage, 1)
            ON CONFLICT (namespace, stage) DO UPDATE SET n = n + 1;
        END""",
    "later_job_count_update": """
        CREATE TRIGGER IF NOT EXISTS later_job_count_update
        AFTER UPDATE OF stage ON later_job WHEN OLD.stage <> NEW.stage
        BEGIN
            INSERT INTO later_stage_count (namespace, stage, n)
            VALUES (OLD.namespace, OLD.stage, -1)
            ON CONFLICT (namespace, stage) DO UPDATE SET n = n - 1;
            INSERT INTO later_stage_count (namespace, stage, n)
            VALUES (NEW.namespace, NEW.stage, 1)
            ON CONFLICT (namespace, stage) DO UPDATE SET n = n + 1;
        END""",
    "later_job_count_delete": """
        CREATE TRIGGER IF NOT EXISTS later_job_count_delete AFTER DELETE ON later_job
        BEGIN
            INSERT INTO later_stage_count (namespace, stage, n)
            VALUES (OLD.namespace, OLD.stage, -1)
            ON CONFLICT (namespace, stage) DO UPDATE SET n = n - 1;
        END""",
}

TABLES_FOUND_SQL: Final = (
    "SELECT name FROM sqlite_master WHERE type = 'table' "
    f"AND name IN ({', '.join(['%s'] * len(TABLES))})"
)

COUNTER_UNIQUE_SQL: Final = (
    "CREATE UNIQUE INDEX IF NOT EXISTS later_count_one_row ON later_stage_count (namespace, stage)"
)


class SqliteDialect(Dialect):
    vendor: ClassVar[str] = "sqlite"
    single_writer: ClassVar[bool] = True
    # julianday('now') has millisecond precision and one value per statement
    # step; the 3.40 library here lacks unixepoch('subsec').
    now_sql: ClassVar[str] = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    cutoff_sql: ClassVar[str] = now_sql
    greatest_sql: ClassVar[str] = "MAX"
    needs_vacuum: ClassVar[bool] = True
    supports_change_counter: ClassVar[bool] = True
    trigger_names: ClassVar[frozenset[str]] = frozenset(TRIGGERS)
    # 6 parameters a row; SQLite allows 32,766 parameters a statement.
    insert_batch_size: ClassVar[int] = 1000

    def __init__(self) -> None:
        super().__init__()
        self.claim_sql = self.render(JOB_CLAIM_SQL)

    def install(self, cursor: CursorWrapper) -> None:
        cursor.execute(COUNTER_UNIQUE_SQL)
        for sql in TRIGGERS.values():
            cursor.execute(sql)

    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'later_job'"
        )
        return {row[0] for row in cursor.fetchall()}

    def database_exists(self, db: BaseDatabaseWrapper) -> bool:
        # Opening a missing file creates it, empty: look before connecting.
        name = str(db.settings_dict["NAME"] or "")
        if name.startswith("file:"):  # a URI: Django opens every NAME with uri=True
            parts = urlsplit(name)
            if "mode=memory" in parts.query:
                return True
            name = unquote(parts.path)
        if not name or name == ":memory:":
            return True  # nothing on disk to create; Django reports an empty NAME
        return os.path.exists(name)

    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        cursor.execute(TABLES_FOUND_SQL, list(TABLES))
        found = {row[0] for row in cursor.fetchall()}
        return [table for table in TABLES if table not in found]

    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        # "no such table" has only SQLite's generic code, so ask the schema.
        # A failed statement leaves SQLite's transaction usable for this
        # read, even where Django refuses queries until the atomic block
        # ends: hence the driver's connection.
        raw = db.connection
        if sqlite_code(exc) != SQLITE_ERROR or raw is None:
            return False
        try:
            found = {row[0] for row in raw.execute(TABLES_FOUND_SQL.replace("%s", "?"), TABLES)}
        except sqlite3.Error:
            return False
        return not found.issuperset(TABLES)

    def job_claim(
        self, cursor: CursorWrapper, *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        cursor.execute(self.claim_sql, [owner, lease_ms, namespace, limit])
        return claimed_jobs(cursor.fetchall())

    def change_counter(self, cursor: CursorWrapper) -> int:
        # Bumped by every commit of another connection to this file; costs no I/O.
        cursor.execute("PRAGMA data_version")
        return int(cursor.fetchone()[0])

    def journal_wal(self, cursor: CursorWrapper) -> bool:
        # WAL lets readers run while a worker writes; it persists in the file.
        cursor.execute("PRAGMA journal_mode")
        if str(cursor.fetchone()[0]).lower() == "wal":
            return False
        cursor.execute("PRAGMA journal_mode=WAL")
        return True

    def vacuum(self, cursor: CursorWrapper) -> bool:
        cursor.execute("VACUUM")
        return True
