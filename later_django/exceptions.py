"""Errors raised by later_django; every one is importable from the package root."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError


class LaterError(Exception):
    """A later_django operation failed."""


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
