"""The one way the retained log reaches its tables: a cursor of the calling
thread's LATER database connection, so every call joins the caller's
``transaction.atomic()`` and commits or rolls back with it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction
from django.db.backends.utils import CursorWrapper

from later_django import schema
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.base import Dialect


@dataclass(frozen=True, slots=True)
class Session:
    """The dialect and a cursor of the LATER database, and its namespace."""

    dialect: Dialect
    cursor: CursorWrapper
    namespace: str


@contextlib.contextmanager
def session(*, atomic: bool = False) -> Iterator[Session]:
    """A cursor on the LATER database; with ``atomic``, its statements are
    one transaction (the caller's, when one is open).

    No savepoint: a database error inside the caller's atomic block leaves
    that block unusable (Django then refuses to commit it), so half of an
    append can never commit. A missing table raises NotMigrated."""
    alias = conf.database
    block = transaction.atomic(using=alias, savepoint=False) if atomic else contextlib.nullcontext()
    try:
        with block, connections[alias].cursor() as cursor:
            yield Session(dialect_for(alias), cursor, conf.namespace)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
