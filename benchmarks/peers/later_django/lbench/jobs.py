"""The harness's no-op job as a later_django handler: ``async def`` here,
``def`` under the later_django_sync adapter (``LBENCH_SYNC=1``), as most
Django code is (the ORM is sync)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from jobrec import record

from later_django import JobContext, job


@dataclass
class BenchNoop:
    n: int
    t: float


if os.environ.get("LBENCH_SYNC"):

    @job
    def noop(ctx: JobContext, payload: BenchNoop) -> None:
        record(payload.n, payload.t)

else:

    @job
    async def noop(ctx: JobContext, payload: BenchNoop) -> None:
        record(payload.n, payload.t)
