"""Statements run on a Django connection's driver connection, past Django's
cursor: the enqueue's one statement, where Django's cursor wrapping would
cost more than the statement (on SQLite, about a fifth of an enqueue).

They run in the connection's own session and transaction, exactly as a
statement through Django's cursor would, keep Django's error wrapping and
are recorded in its query log; only execute wrappers installed with
``connection.execute_wrapper()`` do not see them.
"""

from __future__ import annotations

import functools
import re
import time

from django.db.backends.base.base import BaseDatabaseWrapper


def ready(db: BaseDatabaseWrapper) -> None:
    """What Django's cursor checks before a statement: connected, and not
    inside an atomic block broken by an earlier error."""
    db.ensure_connection()
    db.validate_no_broken_transaction()


def log_query(db: BaseDatabaseWrapper, sql: str, started: float) -> None:
    """Record a statement run past Django's cursor where Django records its own
    (connection.queries, assertNumQueries), so it stays visible when debugging."""
    if db.queries_logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})


@functools.lru_cache(maxsize=512)
def qmark(sql: str) -> str:
    """``sql`` with sqlite3's placeholders for the ones the statements use:
    ``:name`` for ``%(name)s``, ``?`` for ``%s`` (no statement holds a
    literal ``%``)."""
    return _NAMED.sub(r":\1", sql).replace("%s", "?")


_NAMED = re.compile(r"%\((\w+)\)s")
