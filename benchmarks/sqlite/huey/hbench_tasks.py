"""The huey instance (SqliteHuey storage on the peer's file) and the no-op task."""

from __future__ import annotations

import sqlite3

from huey import SqliteHuey
from huey.storage import SqliteStorage
from jobrec import record
from sqlitebench import DB_PATH, SYNCHRONOUS


class BenchStorage(SqliteStorage):
    """SqliteStorage with the ``synchronous`` level every peer of the run uses.

    SqliteHuey sets WAL itself; its ``fsync`` option offers only FULL or OFF.
    """

    def _create_connection(self) -> sqlite3.Connection:
        conn = super()._create_connection()
        conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
        return conn


class BenchHuey(SqliteHuey):
    storage_class = BenchStorage


huey = BenchHuey("bench", filename=DB_PATH)


@huey.task()
def noop(n: int, t: float) -> None:
    record(n, t)
