"""Job ids: lowercase ULIDs (48-bit millisecond time, 80 random bits).

Ids made by one process in the same millisecond increase by one in their
random part, so they sort in creation order (FIFO within a batch).
"""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lowercase
ID_ALPHABET = frozenset(_ALPHABET)
# Every pair of characters (10 bits), so an id is 13 lookups instead of 26.
_PAIRS = [high + low for high in _ALPHABET for low in _ALPHABET]
_LOW_BITS = 50  # the last 10 characters
_HIGH_SHIFTS = range(70, -1, -10)  # the first 16 characters, of value >> _LOW_BITS
_LOW_SHIFTS = range(40, -1, -10)
ULID_LENGTH = 26
_RANDOM_BITS = 80

_lock = threading.Lock()
_last_ms = -1
_last_random = 0


def _forget_after_fork() -> None:
    """A forked child starts afresh: two children continuing their parent's
    last id in the same millisecond would make the same ids."""
    global _lock, _last_ms
    _lock, _last_ms = threading.Lock(), -1


os.register_at_fork(after_in_child=_forget_after_fork)


class JobId(str):
    """A job's id: a 26-character lowercase ULID; sorts by creation time.

    ``duplicate`` is True on the id an enqueue with a unique key returned
    when another job already held the key: that job's id, nothing written."""

    __slots__ = ()
    duplicate = False


class DuplicateJobId(JobId):
    """The id of the job that held an enqueue's unique key (docs/how-to/unique-jobs.md)."""

    __slots__ = ()
    duplicate = True


def new_job_id(now_ms: int | None = None) -> JobId:
    """Return a fresh id whose time part is ``now_ms`` (default: the clock)."""
    now_ms, first = _reserve(1, now_ms)
    return _encode((now_ms << _RANDOM_BITS) | first)


def new_job_ids(count: int, now_ms: int | None = None) -> list[JobId]:
    """Return ``count`` fresh ids in increasing order, made under one lock."""
    now_ms, first = _reserve(count, now_ms)
    ids = []
    prefix_of, prefix = -1, ""
    start = (now_ms << _RANDOM_BITS) | first
    for value in range(start, start + count):
        # Ids of one batch share their first 16 characters; only the last 10 vary.
        high = value >> _LOW_BITS
        if high != prefix_of:
            prefix_of, prefix = high, "".join([_PAIRS[(high >> s) & 1023] for s in _HIGH_SHIFTS])
        ids.append(JobId(prefix + "".join([_PAIRS[(value >> s) & 1023] for s in _LOW_SHIFTS])))
    return ids


def _reserve(count: int, now_ms: int | None) -> tuple[int, int]:
    """The time part and first random part of ``count`` ids in a row."""
    global _last_ms, _last_random
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    with _lock:
        if now_ms <= _last_ms and _last_random + count < (1 << _RANDOM_BITS):
            # Same millisecond (or the clock stepped back): keep the order.
            now_ms, first = _last_ms, _last_random + 1
        else:
            first = int.from_bytes(os.urandom(10), "big") >> 1
        _last_ms, _last_random = now_ms, first + count - 1
    return now_ms, first


# The first 16 characters last encoded, and the value >> _LOW_BITS they
# encode: ids made in one millisecond share them (one tuple, so a thread
# never reads one half of another's pair).
_prefix: tuple[int, str] = (-1, "")


def _encode(value: int) -> JobId:
    global _prefix
    high = value >> _LOW_BITS
    cached, prefix = _prefix
    if high != cached:
        prefix = "".join([_PAIRS[(high >> s) & 1023] for s in _HIGH_SHIFTS])
        _prefix = (high, prefix)
    return JobId(prefix + "".join([_PAIRS[(value >> s) & 1023] for s in _LOW_SHIFTS]))


def id_time_ms(job_id: str) -> int:
    """The time part of a job id: when it was made, on the enqueuing host's
    clock, in epoch ms."""
    ms = 0
    for char in job_id[:10]:
        ms = ms * 32 + _ALPHABET.index(char)
    return ms


def is_job_id(value: object) -> bool:
    """Is ``value`` a job id string (any case)?"""
    return (
        isinstance(value, str)
        and len(value) == ULID_LENGTH
        and all(c in _ALPHABET for c in value.lower())
    )


def as_job_id(value: object, *, argument: str = "job_id") -> JobId:
    """Validate ``value`` as a job id, raising ValueError naming ``argument``."""
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a job id string, got {type(value).__name__}")
    lowered = value.lower()
    if len(lowered) != ULID_LENGTH or any(c not in _ALPHABET for c in lowered):
        raise ValueError(
            f"{argument}={value!r} is not a job id: expected 26 characters of "
            "Crockford base32, as returned by enqueue()"
        )
    return JobId(lowered)
