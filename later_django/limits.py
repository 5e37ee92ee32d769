"""Limits across every server: what they are, and the checks of their values.

A queue's rate limit (``{"rate_limit": "100/m"}`` in LATER["QUEUES"]) and a
job type's concurrency per key (``@job(concurrency_key=..., concurrency=N)``).
No I/O: the claims that keep them are in db/limits.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from later_django.queue_names import DEFAULT_QUEUE

# The options a queue of LATER["QUEUES"] takes.
QUEUE_OPTIONS: Final = frozenset({"rate_limit"})
# "N/s", "N/m" or "N/h": at most N starts per second, minute or hour.
RATE_LIMIT: Final = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
WINDOW_MS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000}
WINDOW_NAMES: Final = {1_000: "second", 60_000: "minute", 3_600_000: "hour"}
MAX_RATE: Final = 1_000_000_000  # starts per window; a row's count is an int column
MAX_KEY_LENGTH: Final = 255  # later_job.concurrency_key's width
MAX_CONCURRENCY: Final = 1_000_000_000

KeyFunction = Callable[[Any], str]


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """At most ``count`` starts per window of ``window_ms``, the windows
    aligned on the database's clock (multiples of ``window_ms`` since the
    epoch)."""

    count: int
    window_ms: int

    def __str__(self) -> str:
        unit = {ms: unit for unit, ms in WINDOW_MS.items()}[self.window_ms]
        return f"{self.count}/{unit}"

    @property
    def window_name(self) -> str:
        return WINDOW_NAMES[self.window_ms]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLimits:
    """What a queue's claims keep: its rate limit, if it has one, and
    whether some job type on it has a concurrency key (``keyed``)."""

    rate: RateLimit | None = None
    keyed: bool = False


def parse_rate_limit(value: object, argument: str = "rate_limit") -> RateLimit:
    """``value`` ("100/m") as a RateLimit; TypeError or ValueError naming
    ``argument`` and the form otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str such as '100/m', got {type(value).__name__}")
    found = RATE_LIMIT.fullmatch(value)
    if found is None or not 1 <= int(found[1]) <= MAX_RATE:
        raise ValueError(
            f"{argument}={value!r} is not a rate limit; write 'N/s', 'N/m' or 'N/h' "
            f"with N from 1 to {MAX_RATE} starts per second, minute or hour, e.g. '100/m'"
        )
    return RateLimit(count=int(found[1]), window_ms=WINDOW_MS[found[2]])


def queue_option_errors(name: str, options: Mapping[Any, Any]) -> list[str]:
    """What is wrong with the options of queue ``name`` (LATER["QUEUES"]),
    one sentence each; empty when nothing is."""
    errors = []
    unknown = sorted(repr(key) for key in options if key not in QUEUE_OPTIONS)
    if unknown:
        errors.append(
            f"LATER['QUEUES'][{name!r}] has unknown options {', '.join(unknown)}; a queue "
            f"takes {', '.join(sorted(QUEUE_OPTIONS))}"
        )
    if "rate_limit" in options:
        try:
            parse_rate_limit(options["rate_limit"], f"LATER['QUEUES'][{name!r}]['rate_limit']")
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    return errors


def rate_limit_of(queues: Mapping[str, Any], name: str) -> RateLimit | None:
    """The rate limit LATER["QUEUES"] (``queues``) gives queue ``name``, if
    any; ValueError naming the setting when it is malformed."""
    options = queues.get(name)
    if not isinstance(options, Mapping) or "rate_limit" not in options:
        return None
    return parse_rate_limit(options["rate_limit"], f"LATER['QUEUES'][{name!r}]['rate_limit']")


def check_concurrency(concurrency_key: object, concurrency: object) -> int | None:
    """The concurrency of ``@job(concurrency_key=..., concurrency=...)``:
    ``concurrency`` (an int >= 1), 1 for a key without one, None for
    neither. TypeError or ValueError naming the option otherwise."""
    if concurrency_key is not None and not callable(concurrency_key):
        raise TypeError(
            "concurrency_key must be a callable taking the payload and returning its "
            f"key (a str), got {type(concurrency_key).__name__}; for one limit over "
            "every job of the type, pass concurrency=N alone"
        )
    if concurrency is None:
        return None if concurrency_key is None else 1
    if not isinstance(concurrency, int) or isinstance(concurrency, bool):
        raise TypeError(f"concurrency must be an int, got {type(concurrency).__name__}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(
            f"concurrency={concurrency} is out of range; use 1..{MAX_CONCURRENCY} "
            "(the most jobs of one key that run at once)"
        )
    return concurrency


def key_of(key_function: KeyFunction | None, payload: object, type_name: str) -> str:
    """The concurrency key of a job of ``payload``: what ``key_function``
    returns for it, or the type's name when the type has none (one limit
    over all its jobs). TypeError or ValueError naming the option when the
    result is not a str of at most 255 characters."""
    if key_function is None:
        return type_name[:MAX_KEY_LENGTH]
    key = key_function(payload)
    if not isinstance(key, str):
        raise TypeError(
            f"concurrency_key of {type_name} returned {type(key).__name__}; it must "
            "return a str (e.g. f'customer-{payload.customer_id}')"
        )
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"concurrency_key of {type_name} returned a key of {len(key)} characters; "
            f"keep keys to {MAX_KEY_LENGTH} (hash a longer one)"
        )
    return key


def queue_limits(
    queues: Mapping[str, Any], keyed_queues: set[str], name: str
) -> QueueLimits | None:
    """The limits the claims of queue ``name`` keep, None when it has none
    (its claim is the plain one): its rate limit from ``queues``
    (LATER["QUEUES"]), and whether it is among ``keyed_queues``."""
    rate = rate_limit_of(queues, name)
    keyed = name in keyed_queues
    if rate is None and not keyed:
        return None
    return QueueLimits(rate=rate, keyed=keyed)


def served_limits(queues: Mapping[str, Any], keyed_queues: set[str]) -> dict[str, QueueLimits]:
    """Every declared queue with a limit, and its limits ("default" too)."""
    names = {DEFAULT_QUEUE, *queues}
    found = {name: queue_limits(queues, keyed_queues, name) for name in sorted(names)}
    return {name: limits for name, limits in found.items() if limits is not None}
