"""The harness's no-op job as a later_django handler."""

from __future__ import annotations

from dataclasses import dataclass

from jobrec import record

from later_django import JobContext, job


@dataclass
class BenchNoop:
    n: int
    t: float


@job
async def noop(ctx: JobContext, payload: BenchNoop) -> None:
    record(payload.n, payload.t)
