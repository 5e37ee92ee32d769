"""SQLite: one writer at a time, so a single UPDATE ... RETURNING claims atomically."""

from __future__ import annotations

import os
import sqlite3
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.base import TABLES, Dialect, claimed_jobs
from later_django.db.errors import SQLITE_ERROR, sqlite_code
from later_django.db.sql import sqlite as sqlite_sql
from later_django.types import ClaimedJob


class SqliteDialect(Dialect):
    vendor: ClassVar[str] = "sqlite"
    single_writer: ClassVar[bool] = True
    now_sql: ClassVar[str] = sqlite_sql.NOW_SQL
    cutoff_sql: ClassVar[str] = sqlite_sql.NOW_SQL
    greatest_sql: ClassVar[str] = "MAX"
    needs_vacuum: ClassVar[bool] = True
    supports_change_counter: ClassVar[bool] = True
    trigger_names: ClassVar[frozenset[str]] = frozenset(sqlite_sql.TRIGGERS)
    # 6 parameters a row; SQLite allows 32,766 parameters a statement.
    insert_batch_size: ClassVar[int] = 1000

    def __init__(self) -> None:
        super().__init__()
        self.claim_sql = self.render(sqlite_sql.JOB_CLAIM_SQL)

    def install(self, cursor: CursorWrapper) -> None:
        cursor.execute(sqlite_sql.COUNTER_UNIQUE_SQL)
        for statement in sqlite_sql.TRIGGERS.values():
            cursor.execute(statement)

    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        cursor.execute(sqlite_sql.INSTALLED_OBJECTS_SQL)
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
        cursor.execute(sqlite_sql.TABLES_FOUND_SQL, list(TABLES))
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
            found = {
                row[0]
                for row in raw.execute(sqlite_sql.TABLES_FOUND_SQL.replace("%s", "?"), TABLES)
            }
        except sqlite3.Error:
            return False
        return not found.issuperset(TABLES)

    def job_claim(
        self, cursor: CursorWrapper, *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        cursor.execute(self.claim_sql, [owner, lease_ms, namespace, limit])
        return claimed_jobs(cursor.fetchall())

    def change_counter(self, cursor: CursorWrapper) -> int:
        cursor.execute(sqlite_sql.DATA_VERSION_SQL)
        return int(cursor.fetchone()[0])

    def journal_wal(self, cursor: CursorWrapper) -> bool:
        # WAL lets readers run while a worker writes; it persists in the file.
        cursor.execute(sqlite_sql.JOURNAL_MODE_SQL)
        if str(cursor.fetchone()[0]).lower() == "wal":
            return False
        cursor.execute(sqlite_sql.JOURNAL_WAL_SQL)
        return True

    def vacuum(self, cursor: CursorWrapper) -> bool:
        cursor.execute(sqlite_sql.VACUUM_SQL)
        return True
