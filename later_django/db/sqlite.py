"""SQLite: one writer at a time, so a single UPDATE ... RETURNING claims atomically."""

from __future__ import annotations

from typing import ClassVar, Final

from django.db.backends.utils import CursorWrapper

from later_django.db.base import CLAIM_RETURNING, CLAIM_SET, Dialect, claimed_jobs
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

COUNTER_UNIQUE_SQL: Final = (
    "CREATE UNIQUE INDEX IF NOT EXISTS later_count_one_row ON later_stage_count (namespace, stage)"
)


class SqliteDialect(Dialect):
    vendor: ClassVar[str] = "sqlite"
    single_writer: ClassVar[bool] = True
    # julianday('now') has millisecond precision and one value per statement
    # step; the 3.40 library here lacks unixepoch('subsec').
    now_sql: ClassVar[str] = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    greatest_sql: ClassVar[str] = "MAX"
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

    def job_claim(
        self, cursor: CursorWrapper, *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        cursor.execute(self.claim_sql, [owner, lease_ms, namespace, limit])
        return claimed_jobs(cursor.fetchall())

    def change_counter(self, cursor: CursorWrapper) -> int:
        # Bumped by every commit of another connection to this file; costs no I/O.
        cursor.execute("PRAGMA data_version")
        return int(cursor.fetchone()[0])

    def vacuum(self, cursor: CursorWrapper) -> bool:
        cursor.execute("VACUUM")
        return True

    def database_size(self, cursor: CursorWrapper) -> int | None:
        cursor.execute("PRAGMA page_count")
        pages = int(cursor.fetchone()[0])
        cursor.execute("PRAGMA page_size")
        return pages * int(cursor.fetchone()[0])
