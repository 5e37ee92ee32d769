"""Errors raised by later_django; every one is importable from the package root."""

from __future__ import annotations

import datetime as dt

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError


class Snooze(Exception):
    """Raise from a handler to run the job again after ``delay``.

    The job goes back to ``delayed``, due ``delay`` after the database's
    now, and this attempt does not count: its retry policy and
    ``ctx.attempt`` are as if it never ran. Its waiting continuations keep
    waiting."""

    def __init__(self, delay: dt.timedelta) -> None:
        if not isinstance(delay, dt.timedelta):
            raise TypeError(f"Snooze(delay) takes a datetime.timedelta, got {type(delay).__name__}")
        if delay < dt.timedelta(0):
            raise ValueError(f"Snooze(delay={delay!r}) is negative; use a timedelta >= 0")
        super().__init__(delay)
        self.delay = delay

    @property
    def delay_ms(self) -> int:
        return int(self.delay.total_seconds() * 1000)


class LaterError(Exception):
    """A later_django operation failed."""


class JobTimeout(LaterError):
    """An attempt ran past its job's timeout: the worker stopped waiting for
    it (an async handler is cancelled, a sync one abandoned with
    ``ctx.cancel_requested`` set), and the attempt failed."""


class TransactionRequired(LaterError):
    """This call must run inside transaction.atomic() on the LATER database."""


class JobNotFound(LaterError):
    """No job with this id exists in this namespace."""


class LeaseLost(LaterError):
    """The lease was taken over by a newer holder; the write was rejected."""


class LaterBusy(LaterError):
    """The database was busy (locked or serialization failure); try again."""


class NotMigrated(LaterError, DatabaseError):
    """later's tables do not exist on LATER["DATABASE"]; run manage.py later_migrate."""


class NotRegistered(LaterError, TypeError):
    """This payload type has no @job handler registered."""


class AlreadyRegistered(LaterError, ImproperlyConfigured):
    """A handler for this payload type is already registered."""


class PayloadTooLarge(TypeError, ValueError):
    """The encoded payload is larger than LATER["MAX_PAYLOAD_BYTES"]."""


class UnknownTopic(LaterError, ValueError):
    """The topic is not registered in LATER["TOPICS"]."""
