"""The harness's no-op job, called by dotted path."""

from __future__ import annotations

from jobrec import record


def noop(n: int, t: float) -> None:
    record(n, t)
