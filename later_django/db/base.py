"""The storage contract: Dialect, one method per operation on later's tables.

Dialect is the abstract base every database vendor implements. Its
operations come per domain (jobs.py, counters.py, servers.py, topics.py,
partitions.py, leases.py, schedules.py, tasks.py, retained_log.py, dashboard.py, each over the
statements of its db/sql/ module): what both
databases share is implemented there once; what differs per vendor is
abstract, or belongs to a capability flag below. Operations on the database
as a whole (schema, file) are here. Each runs on a cursor of the LATER
database, and the caller owns the transaction. db/ imports no runtime code.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Final

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.counters import CounterOperations
from later_django.db.dashboard import DashboardOperations
from later_django.db.jobs import JobOperations
from later_django.db.leases import LeaseOperations
from later_django.db.partitions import PartitionOperations
from later_django.db.retained_log import RetainedLogOperations
from later_django.db.schedules import ScheduleOperations
from later_django.db.servers import ServerOperations
from later_django.db.sql import TABLES as TABLES
from later_django.db.sql import jobs as jobs_sql
from later_django.db.tasks import TaskResultOperations
from later_django.db.topics import TopicOperations

# Operations a dialect implements exactly when it declares the capability,
# and nobody calls otherwise.
CAPABILITY_OPERATIONS: Final = {
    "supports_change_counter": ("change_counter",),
    "needs_vacuum": ("vacuum",),
    "supports_async_connection": ("ajob_claim", "ajob_complete_many"),
}
# The worker's hot path where supports_async_connection is not declared.
INLINE_OPERATIONS: Final = ("job_claim", "job_complete_many")


class Dialect(
    JobOperations,
    CounterOperations,
    ServerOperations,
    TopicOperations,
    PartitionOperations,
    LeaseOperations,
    ScheduleOperations,
    TaskResultOperations,
    RetainedLogOperations,
    DashboardOperations,
    abc.ABC,
):
    """SQL operations on later's tables for one database vendor."""

    # -- capabilities -----------------------------------------------------------------
    # Callers branch on these flags, never on ``vendor``. Flags marked (*)
    # gate operations (CAPABILITY_OPERATIONS): a vendor implements them
    # exactly when it declares the flag (checked when its class is defined).
    vendor: ClassVar[str]
    # Can a worker be woken by the database (LISTEN/NOTIFY), or must it poll?
    supports_listen: ClassVar[bool] = False
    # (*) Does change_counter() tell cheaply that another connection
    # committed? The worker then watches it between polls.
    supports_change_counter: ClassVar[bool] = False
    # (*) Do the worker's claims and completions run on an asyncio connection
    # of its own (ajob_claim, ajob_complete_many)? Else they run inline on a
    # connection that never waits for a lock (job_claim, job_complete_many).
    supports_async_connection: ClassVar[bool] = False
    # Does the database take one writer at a time? Then a server writes
    # through one connection (two of its own would only wait on each other's
    # lock), and nothing commits between a continuation's insert and its
    # transaction's commit, so none needs job_settle_child after it.
    single_writer: ClassVar[bool] = False
    # (*) Does the database file need VACUUM from time to time (vacuum())?
    needs_vacuum: ClassVar[bool] = False
    # The SQL fragments the templates are rendered with: see Statements.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        promised = dict.fromkeys(INLINE_OPERATIONS, not cls.supports_async_connection)
        for flag, names in CAPABILITY_OPERATIONS.items():
            promised.update(dict.fromkeys(names, bool(getattr(cls, flag))))
        wrong = [
            name
            for name, implement in promised.items()
            if (getattr(cls, name) is not getattr(Dialect, name)) != implement
        ]
        if wrong:
            raise TypeError(
                f"{cls.__name__} implements an operation exactly when its capability "
                f"flag says so; check {', '.join(wrong)}"
            )

    # -- the clock ------------------------------------------------------------------
    def clock_now(self, cursor: CursorWrapper) -> int:
        """The database's clock, in epoch ms: what every stored time is on."""
        cursor.execute(self._sql(jobs_sql.CLOCK_NOW_SQL))
        return int(cursor.fetchone()[0])

    # -- schema ---------------------------------------------------------------------
    @abc.abstractmethod
    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        """Names of later's triggers and functions that exist now (what they
        should be is frozen in the migrations: see later_django.objects)."""

    @abc.abstractmethod
    def database_exists(self, db: BaseDatabaseWrapper) -> bool:
        """Does the database of ``db`` exist? Answered without connecting where
        connecting would create it."""

    @abc.abstractmethod
    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        """The tables of TABLES that do not exist, in that order."""

    @abc.abstractmethod
    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        """Did ``exc``, raised by a statement on ``db``, fail because one of
        later's tables does not exist?"""

    @abc.abstractmethod
    def journal_wal(self, cursor: CursorWrapper) -> bool:
        """Switch the database to write-ahead logging where that is a setting
        of the file; return whether it changed."""

    def vacuum(self, cursor: CursorWrapper) -> bool:
        """(needs_vacuum) Compact the database file; return whether it ran."""
        raise NotImplementedError(f"{self.vendor} needs no VACUUM")

    # -- wake-ups -----------------------------------------------------------------------
    def change_counter(self, cursor: CursorWrapper) -> int:
        """(supports_change_counter) A number that changes whenever another
        connection commits."""
        raise NotImplementedError(f"{self.vendor} has no change counter")
