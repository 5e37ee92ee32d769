"""Cron expressions and the occurrences a schedule owes: pure, no I/O.

Fire times are epoch milliseconds on the database's clock; the expression is
read in its zone, so "0 9 * * *" in Europe/Paris fires at nine local time
on both sides of a daylight-saving change.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass

from croniter import CroniterBadDateError, CroniterError, croniter

# croniter reads a sixth field as seconds at the end; the reference puts it
# first ("0 30 9 * * *" is 09:30:00), and so do we.
FIELDS_WITHOUT_SECONDS = 5
FIELDS_WITH_SECONDS = 6


@dataclass(frozen=True, slots=True)
class Cron:
    """A valid cron expression in a zone; ``zone`` is its IANA name."""

    expr: str
    zone: str

    def next_after(self, ms: int) -> int:
        """The first fire time strictly after ``ms``.

        When clocks go back, a local time exists twice. A cron that names its
        hours ("30 2 * * *") fires at the first of the two only, once a day as
        its wall clock says; one that repeats through the hours ("*/15 * * *
        *") fires by real time through both."""
        times = self._iter(ms)
        zone = zoneinfo.ZoneInfo(self.zone)
        while True:
            fire = _to_ms(times.get_next(dt.datetime))
            if not (self._names_hours and _local(fire, zone).fold):
                return fire

    @property
    def _names_hours(self) -> bool:
        if self.expr.startswith("@"):
            return self.expr not in ("@hourly", "@minutely")
        fields = self.expr.split(" ")
        hours = fields[2] if len(fields) == FIELDS_WITH_SECONDS else fields[1]
        return "*" not in hours

    def last_before(self, ms: int) -> int:
        """The last fire time strictly before ``ms``."""
        return _to_ms(self._iter(ms).get_prev(dt.datetime))

    def _iter(self, ms: int) -> croniter:
        start = _local(ms, zoneinfo.ZoneInfo(self.zone))
        return croniter(self.expr, start, second_at_beginning=_has_seconds(self.expr))


def parse(expr: object, tz: object = None) -> Cron:
    """Check ``expr`` and ``tz``; raise TypeError or ValueError naming the fix.

    ``expr``: 5 fields (minute hour day month weekday), 6 with seconds first,
    or a nickname such as ``@hourly``. ``tz``: an IANA zone name or a
    ``zoneinfo.ZoneInfo``; None is UTC.
    """
    if not isinstance(expr, str):
        raise TypeError(f"cron must be a str, got {type(expr).__name__}")
    expr = " ".join(expr.split())
    zone = _zone_name(tz)
    fields = expr.split(" ")
    if not expr.startswith("@") and len(fields) not in (
        FIELDS_WITHOUT_SECONDS,
        FIELDS_WITH_SECONDS,
    ):
        raise ValueError(
            f"cron {expr!r} has {len(fields)} fields; use 5 (minute hour day month "
            "weekday) or 6 with seconds first (second minute hour day month weekday)"
        )
    try:
        croniter(expr, second_at_beginning=_has_seconds(expr))
    except CroniterError as exc:
        raise ValueError(f"cron {expr!r} is not a valid expression: {exc}") from None
    cron = Cron(expr, zone)
    try:
        cron.next_after(0)
    except CroniterBadDateError:
        raise ValueError(f"cron {expr!r} never fires (no such date)") from None
    return cron


def _has_seconds(expr: str) -> bool:
    return not expr.startswith("@") and len(expr.split(" ")) == FIELDS_WITH_SECONDS


def _zone_name(tz: object) -> str:
    if tz is None:
        return "UTC"
    if isinstance(tz, zoneinfo.ZoneInfo):
        return tz.key
    if not isinstance(tz, str):
        raise TypeError(
            f"tz must be an IANA zone name such as 'Europe/Paris' or a zoneinfo.ZoneInfo, "
            f"got {type(tz).__name__}"
        )
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"tz={tz!r} is not a known time zone; use an IANA name such as "
            "'Europe/Paris' or 'UTC' (install the tzdata package if the system has none)"
        ) from None
    return tz


def _local(ms: int, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=zone)


def _to_ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Due:
    """What a schedule owes at one moment: the fire times to enqueue now, in
    order, and the next fire time after them."""

    fire_ms: tuple[int, ...]
    next_run_ms: int
    # Occurrences missed by more than the grace and not run: the first of
    # ``fire_ms`` (the latest of them) stands for them all. 0 when none were.
    skipped: int


def due(
    cron: Cron, next_run_ms: int, *, now_ms: int, ahead_ms: int, grace_ms: int, limit: int
) -> Due:
    """The occurrences of ``cron`` from ``next_run_ms`` to ``now_ms + ahead_ms``.

    Occurrences missed by less than ``grace_ms`` are all owed; of those
    missed by more (after downtime), only the latest is, once. At most
    ``limit`` are returned; the rest stay owed from ``next_run_ms``.
    """
    horizon = now_ms + ahead_ms
    fires: list[int] = []
    skipped = 0
    at = next_run_ms
    late_before = now_ms - grace_ms
    if at < late_before:
        latest = max(cron.last_before(late_before), at)
        # The count stops at limit + 1: a minute cron down for a year is not
        # walked through.
        skipped = _count_between(cron, at, latest, limit + 1)
        fires.append(latest)
        at = cron.next_after(latest)
    while at <= horizon and len(fires) < limit:
        fires.append(at)
        at = cron.next_after(at)
    return Due(fire_ms=tuple(fires), next_run_ms=at, skipped=skipped)


def _count_between(cron: Cron, first: int, last: int, cap: int) -> int:
    """How many fire times lie in [first, last), counting at most ``cap``."""
    count, at = 0, first
    while at < last and count < cap:
        count += 1
        at = cron.next_after(at)
    return count
