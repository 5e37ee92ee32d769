"""Filters of the dashboard's templates: epoch milliseconds, durations and sizes as text."""

from __future__ import annotations

import datetime as dt

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def ms_datetime(ms: int | None, precision: str = "ms") -> str:
    """``2026-12-02 02:10:05.123 UTC`` (``2026-12-02 02:10:05 UTC`` with the
    precision "s"): the time in the active time zone (the admin's: TIME_ZONE,
    or the one a middleware activated), with that zone's abbreviation at that
    time (``CET``, ``CEST``)."""
    if not isinstance(ms, int):
        return "—"
    moment = timezone.localtime(dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC))
    millis = f".{moment.microsecond // 1000:03d}" if precision == "ms" else ""
    return moment.strftime(f"%Y-%m-%d %H:%M:%S{millis} %Z")


@register.filter
def duration_ms(ms: float | None) -> str:
    if not isinstance(ms, int | float):
        return "—"  # a figure with nothing measured yet
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@register.filter
def size_bytes(n: int | None) -> str:
    if not isinstance(n, int):
        return "—"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
