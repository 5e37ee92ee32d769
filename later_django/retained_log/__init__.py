"""The retained log: append-only records in partitions of a topic, replayable
by offset, with consumer groups that commit offsets under fenced leases.

A database log on LATER["DATABASE"], not a Kafka protocol. Use it as
``from later_django import retained_log as log``. Every call has an async
twin with an ``a`` prefix (``aappend``, ``aread``, ``aacquire``, ...;
``Lease.acommit``, ``Lease.arenew``, ``Lease.arelease``). See
docs/how-to/retained-log.md.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from later_django.exceptions import LeaseLost
from later_django.retained_log.appends import append, append_many
from later_django.retained_log.consumer import ConsumeResult, consume
from later_django.retained_log.groups import Lease, acquire
from later_django.retained_log.reads import configured_lag, lag, read
from later_django.retained_log.records import Record
from later_django.retained_log.topics import register_topic

aregister_topic = sync_to_async(register_topic)
aappend = sync_to_async(append)
aappend_many = sync_to_async(append_many)
aread = sync_to_async(read)
aacquire = sync_to_async(acquire)
alag = sync_to_async(lag)


def _consume_on_own_thread(*args: Any, **kwargs: Any) -> ConsumeResult:
    try:
        return consume(*args, **kwargs)
    finally:
        connections.close_all()  # this thread's, opened for this call


# consume() blocks while it runs: its twin runs it on a thread of its own,
# not on the one thread Django keeps for sync_to_async calls.
aconsume = sync_to_async(_consume_on_own_thread, thread_sensitive=False)
aconsume.__doc__ = "Run :func:`consume` from async code, on a thread of its own."

__all__ = [
    "ConsumeResult",
    "Lease",
    "LeaseLost",
    "Record",
    "aacquire",
    "aappend",
    "aappend_many",
    "aconsume",
    "acquire",
    "alag",
    "append",
    "append_many",
    "aread",
    "aregister_topic",
    "configured_lag",
    "consume",
    "lag",
    "read",
    "register_topic",
]
