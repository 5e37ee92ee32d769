"""The order checker of sequential partition mode: per key, the runs whose
outcome was stored start and end in enqueue order, one at a time.

Handlers of ``tests.jobapp.jobs.Ordered`` record ``ordered-start`` and then
``ordered-end`` or ``ordered-fail`` with the tag ``<key>:<n>`` (n: the
enqueue order within the key). A run counts when its outcome was stored: a
failure (its retry keeps the job's place), or the success of the job's final
attempt. Runs that never ended (their process was killed) or ended after
their lease was lost (their outcome was discarded: the job ran again) are
the at-least-once repeats every lease-based system has; they are counted
apart, never as order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import read_records


@dataclass(frozen=True)
class Run:
    key: str
    n: int
    job_id: str
    attempt: int
    pid: int
    start: float
    end: float | None
    failed: bool


def ordered_runs(record: Path) -> dict[str, list[Run]]:
    """Every run of an Ordered job per key, in start order."""
    starts = {}
    ends: dict[tuple[str, int], tuple[float, bool]] = {}
    for r in read_records(record):
        if r.kind == "ordered-start":
            starts[(r.job_id, r.attempt)] = r
        elif r.kind in ("ordered-end", "ordered-fail"):
            ends[(r.job_id, r.attempt)] = (r.start, r.kind == "ordered-fail")
    runs: dict[str, list[Run]] = defaultdict(list)
    for (job_id, attempt), r in starts.items():
        key, n = r.tag.rsplit(":", 1)
        end = ends.get((job_id, attempt))
        runs[key].append(
            Run(
                key=key,
                n=int(n),
                job_id=job_id,
                attempt=attempt,
                pid=r.pid,
                start=r.start,
                end=None if end is None else end[0],
                failed=bool(end and end[1]),
            )
        )
    return {key: sorted(v, key=lambda run: run.start) for key, v in runs.items()}


def stored_runs(record: Path, final_attempts: dict[str, int]) -> dict[str, list[Run]]:
    """The runs whose outcome was stored, per key in start order, given each
    job's final attempt (the one that succeeded)."""
    return {
        key: [
            run
            for run in runs
            if run.end is not None and (run.failed or final_attempts.get(run.job_id) == run.attempt)
        ]
        for key, runs in ordered_runs(record).items()
    }


def order_violations(runs_per_key: dict[str, list[Run]]) -> list[str]:
    """Runs of one key that overlap, or that go back in enqueue order (a
    job runs again only after its own failed run)."""
    problems = []
    for key, runs in runs_per_key.items():
        for before, after in zip(runs, runs[1:], strict=False):
            assert before.end is not None
            if after.start < before.end:
                problems.append(
                    f"{key}: {after.n} (attempt {after.attempt}) started before "
                    f"{before.n} (attempt {before.attempt}) ended"
                )
            if after.n < before.n or (after.n == before.n and not before.failed):
                problems.append(f"{key}: {after.n} ran after {before.n}")
    return problems


def checked_pairs(runs_per_key: dict[str, list[Run]]) -> int:
    """How many consecutive pairs order_violations() compared."""
    return sum(max(len(runs) - 1, 0) for runs in runs_per_key.values())
