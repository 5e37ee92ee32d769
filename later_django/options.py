"""EnqueueOptions: everything an enqueue call asks for besides the payload.

Every argument of the enqueue API is checked here, once, when the options are
made, so a call that raises has written nothing. No I/O and no settings.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypedDict

from later_django.clock import from_datetime, now_ms
from later_django.ids import JobId, as_job_id
from later_django.queue_names import check_queue_name

MIN_PRIORITY, MAX_PRIORITY = -100, 100
# The last time a job may become due: later dates do not fit in a datetime.
LATEST_RUN_AT_MS = int(dt.datetime(9999, 12, 30, tzinfo=dt.UTC).timestamp() * 1000)


class _Unset(enum.Enum):
    UNSET = "unset"

    def __repr__(self) -> str:
        return "UNSET"


# "Not given", for the options that None cannot mean: enqueue_delayed(p, None)
# must raise as a bad delay, not enqueue a job without one.
UNSET: Final = _Unset.UNSET
Unset = Literal[_Unset.UNSET]


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOptions:
    """How to enqueue a payload: the enqueue keywords, under the same names.

    Same names so that an error names the keyword to fix. Making one checks
    every field (TypeError or ValueError, as the enqueue calls document) and
    fills the derived ones the builder reads. A keyword left out is UNSET, and
    None is a bad value here: ``keyword_options`` maps the keyword API's None
    defaults to UNSET, while ``enqueue_delayed(p, None)`` must raise.
    """

    priority: int | None = None
    delay: dt.timedelta | Unset = UNSET
    at: dt.datetime | Unset = UNSET
    # A list is kept as a tuple of its ids, checked and without duplicates.
    after: str | Iterable[str] | Unset = UNSET
    timeout: dt.timedelta | Unset = UNSET
    # The queue's name (None: the type's @job(queue=...), else "default");
    # whether LATER["QUEUES"] declares it is the builder's check.
    queue: str | None = None
    # The job's unique key (None: the type's @job(unique_key=...), if any),
    # and the window over finished jobs too (docs/how-to/unique-jobs.md).
    unique_key: str | None = None
    unique_for: dt.timedelta | Unset = UNSET
    # The caller's name of a keyword, where it differs (enqueue_continue's
    # ``parent`` is ``after``), for its errors.
    names: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    # Derived, in the units of a NewJob: set once by __post_init__.
    delay_ms: int = field(default=0, init=False, repr=False, compare=False)
    run_at_ms: int | None = field(default=None, init=False, repr=False, compare=False)
    parent_id: str | None = field(default=None, init=False, repr=False, compare=False)
    # A fan-in job's parents (two or more); parent_id is the first.
    parent_ids: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)
    timeout_ms: int | None = field(default=None, init=False, repr=False, compare=False)
    unique_for_ms: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Timing, then parent, then priority: the order in which the enqueue
        # calls have always checked their arguments, so a call with two bad
        # arguments keeps raising the same error.
        delay, at = self.delay, self.at
        name = self.names.get
        if delay is not UNSET:
            if at is not UNSET:
                raise TypeError("delay and at both say when the job runs: pass one of them")
            delay_ms = _delay_ms(delay)
            # Bounded by this host's clock: the database's cannot be read
            # here, and a skew of minutes does not matter nine millennia out.
            _check_latest(now_ms() + delay_ms)
            object.__setattr__(self, "delay_ms", delay_ms)
        elif at is not UNSET:
            run_at_ms = _check_latest(from_datetime(at, argument=name("at", "at")))
            object.__setattr__(self, "run_at_ms", run_at_ms)
        if self.after is not UNSET:
            if delay is not UNSET or at is not UNSET:
                timing = "delay" if delay is not UNSET else "at"
                raise TypeError(
                    f"after and {timing} both say when the job runs: a continuation is due "
                    f"when its parent succeeds; pass no {timing} with after"
                )
            if isinstance(self.after, str):
                parent_id = as_job_id(self.after, argument=name("after", "after"))
            else:
                parents = parent_list(self.after, name("after", "after"))
                object.__setattr__(self, "after", parents)
                parent_id = parents[0]
                if len(parents) > 1:
                    object.__setattr__(self, "parent_ids", parents)
            object.__setattr__(self, "parent_id", parent_id)
        if self.priority is not None:
            check_priority(self.priority)
        if self.timeout is not UNSET:
            object.__setattr__(self, "timeout_ms", timeout_ms(self.timeout, "timeout"))
        if self.queue is not None:
            check_queue_name(self.queue)
        if self.unique_key is not None:
            check_unique_key(self.unique_key, "unique_key")
        if self.unique_for is not UNSET:
            object.__setattr__(self, "unique_for_ms", timeout_ms(self.unique_for, "unique_for"))

    @property
    def bulk_ready(self) -> bool:
        """Are these a ready job's options that a bulk insert stores (no
        delay, time, parent, timeout or unique key)?"""
        return (
            self.delay is UNSET
            and self.at is UNSET
            and self.after is UNSET
            and self.timeout is UNSET
            and self.unique_key is None
            and self.unique_for is UNSET
        )


class EnqueueKeywords(TypedDict, total=False):
    """The enqueue keywords, for calls that pass them on (JobContext)."""

    priority: int | None
    delay: dt.timedelta | None
    at: dt.datetime | None
    after: str | Iterable[str] | None
    timeout: dt.timedelta | None
    queue: str | None
    unique_key: str | None
    unique_for: dt.timedelta | None


def keyword_options(
    *,
    priority: int | None = None,
    delay: dt.timedelta | None = None,
    at: dt.datetime | None = None,
    after: str | Iterable[str] | None = None,
    timeout: dt.timedelta | None = None,
    queue: str | None = None,
    unique_key: str | None = None,
    unique_for: dt.timedelta | None = None,
) -> EnqueueOptions:
    """The options of the enqueue keywords, where None means "not given"."""
    if (
        priority is None
        and delay is None
        and at is None
        and after is None
        and timeout is None
        and queue is None
        and unique_key is None
        and unique_for is None
    ):
        return PLAIN
    return EnqueueOptions(
        priority=priority,
        delay=UNSET if delay is None else delay,
        at=UNSET if at is None else at,
        after=UNSET if after is None else after,
        timeout=UNSET if timeout is None else timeout,
        queue=queue,
        unique_key=unique_key,
        unique_for=UNSET if unique_for is None else unique_for,
    )


def parent_list(parents: object, argument: str) -> tuple[JobId, ...]:
    """The job ids of the list ``parents``, checked, in order, each once.

    Raises TypeError when it is not a list of job id strings and ValueError
    when it is empty or holds a malformed id, naming ``argument``."""
    if isinstance(parents, str | bytes | bytearray | Mapping) or not isinstance(parents, Iterable):
        raise TypeError(
            f"{argument} must be a job id or a list of job ids, got {type(parents).__name__}"
        )
    ids = [as_job_id(value, argument=f"{argument}[{i}]") for i, value in enumerate(parents)]
    if not ids:
        raise ValueError(
            f"{argument}=[] names no parent job: pass at least one job id, or leave "
            f"{argument} out to enqueue a job that runs at once"
        )
    return tuple(dict.fromkeys(ids))


def check_one_parent(parent: object, plural: str) -> None:
    """Refuse a list as the ``parent`` of a call named after one parent,
    with a TypeError pointing to ``plural``; the options check the rest."""
    if not isinstance(parent, str | bytes | bytearray) and isinstance(parent, Iterable):
        raise TypeError(
            f"parent must be a job id string, got {type(parent).__name__}; to wait for "
            f"several parents use {plural}"
        )


def check_priority(priority: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"priority={priority} is out of range; use {MIN_PRIORITY}..{MAX_PRIORITY} "
            "(higher runs first)"
        )


# The longest unique key: the column's width.
MAX_UNIQUE_KEY = 255


def check_unique_key(key: object, argument: str) -> None:
    """A unique key is a non-empty str of at most MAX_UNIQUE_KEY characters."""
    if not isinstance(key, str):
        raise TypeError(
            f"{argument} must be a str, got {type(key).__name__}; build the key from the "
            'payload\'s fields, e.g. f"user-{payload.user_id}"'
        )
    if not key or len(key) > MAX_UNIQUE_KEY:
        raise ValueError(
            f"{argument} has {len(key)} characters; use 1 to {MAX_UNIQUE_KEY} (hash a longer "
            "key, e.g. with hashlib.sha256)"
        )


def timeout_ms(timeout: object, argument: str) -> int:
    """``timeout`` (a timedelta of at least a millisecond) in ms."""
    if not isinstance(timeout, dt.timedelta):
        raise TypeError(f"{argument} must be a datetime.timedelta, got {type(timeout).__name__}")
    ms = int(timeout.total_seconds() * 1000)
    if ms < 1:
        raise ValueError(f"{argument}={timeout!r} is not positive; use a timedelta of 1 ms or more")
    return ms


def _delay_ms(delay: object) -> int:
    if not isinstance(delay, dt.timedelta):
        raise TypeError(f"delay must be a datetime.timedelta, got {type(delay).__name__}")
    if delay < dt.timedelta(0):
        raise ValueError(f"delay={delay!r} is negative; use a timedelta >= 0")
    return int(delay.total_seconds() * 1000)


def _check_latest(run_at_ms: int) -> int:
    if run_at_ms > LATEST_RUN_AT_MS:
        raise ValueError(
            "the job would become due after 9999-12-30, which no datetime can "
            "represent; use a shorter delay or an earlier time"
        )
    return run_at_ms


# The reference's calls name two keywords their own way.
AT_IS_WHEN: Final = {"at": "when"}
AFTER_IS_PARENT: Final = {"after": "parent"}
AFTER_IS_PARENTS: Final = {"after": "parents"}

# The options of a plain enqueue, made once: the hot path pays for no object.
PLAIN = EnqueueOptions()
