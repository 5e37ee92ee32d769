"""Reading back what the chaos handlers recorded (see app/jobs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    """One handler run: its start line and, if written, its end line."""

    job_id: str
    attempt: int
    pid: int
    start: float
    kind: str
    n: int
    end: float | None = None
    # ok | raise | cancelled (an async handler its worker cancelled) | None (no end line:
    # its process was killed, or it never ended: a hang)
    outcome: str | None = None
    # A partitioned job's partition key and place among that key's jobs.
    key: str | None = None
    seq: int | None = None


def read_runs(folder: Path) -> list[Run]:
    """Every run, in start order. Lines cut short by a kill are skipped."""
    runs: list[Run] = []
    by_key: dict[tuple[str, int, int], list[Run]] = {}
    ends: list[tuple[str, int, int, float, str]] = []
    for path in sorted(folder.glob("rec-*.txt")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ")
            try:
                if parts[0] == "S" and len(parts) in (7, 9):
                    run = Run(
                        parts[1],
                        int(parts[2]),
                        int(parts[3]),
                        float(parts[4]),
                        parts[5],
                        int(parts[6]),
                    )
                    if len(parts) == 9:  # a partitioned job: its key and place
                        run.key, run.seq = parts[7], int(parts[8])
                    runs.append(run)
                    by_key.setdefault((run.job_id, run.attempt, run.pid), []).append(run)
                elif parts[0] == "E" and len(parts) == 6:
                    ends.append((parts[1], int(parts[2]), int(parts[3]), float(parts[4]), parts[5]))
            except ValueError:
                continue
    for job_id, attempt, pid, at, outcome in ends:
        for run in by_key.get((job_id, attempt, pid), []):
            if run.end is None and run.start <= at:
                run.end, run.outcome = at, outcome
                break
    return sorted(runs, key=lambda r: r.start)
