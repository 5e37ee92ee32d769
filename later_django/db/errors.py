"""Database errors sorted once, by SQLSTATE or SQLite result code, never by message.

A transient error (the server restarting, a dropped connection, a lock or
serialization conflict, SQLite's write lock held elsewhere) may succeed when
the same statement runs again; any other error will fail again the same way.
"""

from __future__ import annotations

import sqlite3
from typing import Final

# SQLSTATE classes and codes worth retrying (PostgreSQL appendix A).
TRANSIENT_SQLSTATE_CLASSES: Final = frozenset(
    {
        "08",  # connection exception
        "53",  # insufficient resources (too many connections, out of memory)
        "57",  # operator intervention (admin shutdown, crash shutdown, cannot connect now)
        "58",  # system error (I/O)
    }
)
TRANSIENT_SQLSTATES: Final = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
        "55006",  # object_in_use
        "25P04",  # transaction_timeout
    }
)
# A table named in the statement does not exist.
UNDEFINED_TABLE: Final = "42P01"
# SQLite's generic error code: "no such table" among many others.
SQLITE_ERROR: Final = 1
# SQLite primary result codes worth retrying.
SQLITE_BUSY: Final = 5
SQLITE_LOCKED: Final = 6
TRANSIENT_SQLITE_CODES: Final = frozenset(
    {
        SQLITE_BUSY,
        SQLITE_LOCKED,
        10,  # SQLITE_IOERR
        13,  # SQLITE_FULL: the disk may be freed
        14,  # SQLITE_CANTOPEN
        15,  # SQLITE_PROTOCOL
    }
)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (Django wraps the driver's error as its cause)."""
    chain = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def is_transient(exc: BaseException) -> bool:
    """Would running the same statement again possibly succeed?"""
    from later_django.exceptions import LaterBusy

    for err in _causes(exc):
        if isinstance(err, LaterBusy | ConnectionError | TimeoutError):
            return True
        code = getattr(err, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF in TRANSIENT_SQLITE_CODES
        if type(err).__module__.startswith("psycopg"):
            sqlstate = getattr(err, "sqlstate", None)
            if sqlstate is None:
                # No server answer at all: the connection failed or was closed.
                return type(err).__name__ in ("OperationalError", "InterfaceError")
            return sqlstate in TRANSIENT_SQLSTATES or sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES
    return False


def is_busy(exc: BaseException) -> bool:
    """Another connection holds a lock or won a conflict: SQLite's write lock,
    a PostgreSQL serialization failure, deadlock or lock timeout."""
    for err in _causes(exc):
        code = getattr(err, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
        sqlstate = getattr(err, "sqlstate", None)
        if isinstance(sqlstate, str):
            return sqlstate in ("40001", "40P01", "55P03")
    return False


def is_sqlite_locked(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock."""
    return getattr(exc, "sqlite_errorcode", None) is not None and exc.sqlite_errorcode & 0xFF in (
        SQLITE_BUSY,
        SQLITE_LOCKED,
    )


def sqlstate(exc: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE of ``exc`` or of the error it wraps."""
    for err in _causes(exc):
        state = getattr(err, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


def sqlite_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of ``exc`` or of the error it wraps."""
    for err in _causes(exc):
        code = getattr(err, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF
    return None
