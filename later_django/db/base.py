"""The storage contract: a Dialect per database vendor, and its stores.

A dialect is one store per concern, each a small interface over the
statements of its db/sql/ module, written once for both vendors where they
agree. Four stores share ``later_job``, one per part of a job's life:

    enqueue     inserts of jobs, and settling a child after its commit
                (db/enqueue.py)
    hot         the worker's claims, completions and fenced writes
                (db/hot.py)
    control     an operator's or a caller's actions on a job (db/control.py)
    upkeep      maintenance: due jobs, stuck jobs, orphans, pruning,
                counters (db/upkeep.py)
    schedules   recurring jobs and their occurrences (db/schedules.py)
    partitions  topics, sequences, partition leases and heads (db/partitions.py)
    log         the retained log (db/retained_log.py)
    reads       counts, the dashboard's figures and lists, lookups (db/reads.py)
    limits      claims that keep rate and concurrency limits, and their reads
                (db/limits.py)
    cluster     servers, the maintenance gate, named leases (db/cluster.py)

What differs per vendor is a subclass of a store (the vendor's module says
which), a capability flag below, or the vendor's SQL (statements.VendorSql).
A store that needs another's operations is given that store, never reaches
past it; what several stores run alike is a function they share (failing a
job's waiting descendants: db/descendants.py), not a call into one of them.
Operations on the database as a whole (schema, file, clock) are the
dialect's own. Each runs on a cursor of the LATER database, and the caller
owns the transaction. db/ imports no runtime code: what a setting decides
(LATER["PREPARED_STATEMENTS"]) reaches it as a value of each call.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Final

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.cluster import Cluster
from later_django.db.control import ControlStore
from later_django.db.enqueue import EnqueueStore
from later_django.db.hot import HotStore
from later_django.db.limits import LimitStore
from later_django.db.partitions import PartitionStore
from later_django.db.reads import ReadModels
from later_django.db.retained_log import LogStore
from later_django.db.schedules import ScheduleStore
from later_django.db.sql import TABLES as TABLES
from later_django.db.sql import database as database_sql
from later_django.db.statements import Statements, VendorSql, run
from later_django.db.upkeep import UpkeepStore

# Operations a vendor implements exactly when it declares the capability,
# and nobody calls otherwise: (flag, where, names).
CAPABILITY_OPERATIONS: Final = (
    ("supports_change_counter", "dialect", ("change_counter",)),
    ("needs_vacuum", "dialect", ("vacuum",)),
    ("supports_async_connection", "hot", ("aclaim", "acomplete_many")),
    ("supports_async_connection", "limits", ("aclaim_limited",)),
    (
        "supports_async_connection",
        "partitions",
        ("apartition_heads", "apartition_claim", "apartition_complete_many"),
    ),
)


class Dialect(abc.ABC):
    """later's stores, and the operations on the whole database, for one vendor."""

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
    # of its own (hot.aclaim, hot.acomplete_many, limits.aclaim_limited, and
    # the partitions' apartition_*)? Else they run inline on a connection
    # that never waits for a lock.
    supports_async_connection: ClassVar[bool] = False
    # Does the database take one writer at a time? Then a server writes
    # through one connection (two of its own would only wait on each other's
    # lock), and nothing commits between a continuation's insert and its
    # transaction's commit, so none needs enqueue.settle_child after it.
    single_writer: ClassVar[bool] = False
    # (*) Does the database file need VACUUM from time to time (vacuum())?
    needs_vacuum: ClassVar[bool] = False

    # -- what the vendor brings -------------------------------------------------------
    # The SQL fragments its statements are rendered with, and its walks of a
    # job's descendants.
    vendor_sql: ClassVar[VendorSql]
    # Its stores of job rows whose statements differ (control's do not).
    enqueue_store: ClassVar[type[EnqueueStore]]
    hot_store: ClassVar[type[HotStore]]
    upkeep_store: ClassVar[type[UpkeepStore]]
    # Its partition store (the claims and successes of heads differ), and
    # its log store where it has one of its own.
    partition_store: ClassVar[type[PartitionStore]]
    log_store: ClassVar[type[LogStore]] = LogStore
    # Its store of limited claims (db/limits.py).
    limit_store: ClassVar[type[LimitStore]]

    def __init__(self) -> None:
        sql = Statements(self.vendor_sql)
        self._sql = sql
        self.enqueue: EnqueueStore = self.enqueue_store(sql)
        self.hot: HotStore = self.hot_store(sql)
        self.control = ControlStore(sql)
        self.upkeep: UpkeepStore = self.upkeep_store(sql)
        self.schedules = ScheduleStore(sql)
        self.partitions: PartitionStore = self.partition_store(sql, self.enqueue, self.hot)
        self.log = self.log_store(sql)
        self.limits: LimitStore = self.limit_store(sql)
        self.reads = ReadModels(sql)
        self.cluster = Cluster(sql)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        bases = {
            "dialect": (cls, Dialect),
            "hot": (cls.hot_store, HotStore),
            "limits": (cls.limit_store, LimitStore),
            "partitions": (cls.partition_store, PartitionStore),
        }
        wrong = [
            name
            for flag, where, names in CAPABILITY_OPERATIONS
            for name in names
            if (getattr(bases[where][0], name) is not getattr(bases[where][1], name))
            != bool(getattr(cls, flag))
        ]
        if wrong:
            raise TypeError(
                f"{cls.__name__} implements an operation exactly when its capability "
                f"flag says so; check {', '.join(wrong)}"
            )

    # -- the clock ------------------------------------------------------------------
    def clock_now(self, cursor: CursorWrapper) -> int:
        """The database's clock, in epoch ms: what every stored time is on."""
        run(cursor, self._sql, database_sql.CLOCK_NOW)
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
    def database_size(self, cursor: CursorWrapper) -> int:
        """The whole database's size on disk in bytes, later's tables and the
        application's alike."""

    @abc.abstractmethod
    def journal_wal(self, cursor: CursorWrapper) -> bool:
        """Switch the database to write-ahead logging where that is a setting
        of the file; return whether it changed."""

    def vacuum(self, cursor: CursorWrapper) -> bool:
        """(needs_vacuum) Compact the database file; return whether it ran."""
        raise NotImplementedError(f"{self.vendor} needs no VACUUM")

    # -- wake-ups -----------------------------------------------------------------------
    def announce_ready(self, cursor: CursorWrapper, *, namespace: str, queue: str) -> None:
        """Tell idle workers of ``queue`` on other hosts that
        its jobs may be ready (a resumed queue), at commit. Without LISTEN,
        their watch of the database finds the commit itself."""
        return None

    def change_counter(self, cursor: CursorWrapper) -> int:
        """(supports_change_counter) A number that changes whenever another
        connection commits."""
        raise NotImplementedError(f"{self.vendor} has no change counter")
