"""Stalls of the whole host, seen by a process that does nothing but sleep.

A virtual machine can stop every process for seconds (another tenant, the
hypervisor, a slow disk under memory pressure). Every lease of every worker
then runs out at once, and the jobs run again after the stall: the same
at-least-once recovery a ``pause`` fault tests, but no fault of the run
caused it. The sentinel is a separate interpreter with no Django, no
database driver and no other thread: when it wakes much later than it asked
to, nothing of ours held it back, so the host did.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Late by this much means the host did not run the sentinel: its sleep is 50 ms.
STALL_SECONDS = 1.0

_SENTINEL = """
import sys, time
out = open(sys.argv[1], "a", buffering=1)
limit = float(sys.argv[2])
while True:
    asked = time.monotonic()
    time.sleep(0.05)
    late = time.monotonic() - asked - 0.05
    if late >= limit:
        now = time.time()
        out.write(f"{now - late:.3f} {now:.3f}\\n")
"""


@dataclass(frozen=True)
class HostStall:
    start: float  # wall clock, like the handlers' records
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class HostClock:
    """Runs the sentinel for the length of a chaos run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _SENTINEL, str(self.path), str(STALL_SECONDS)]
        )
        # The sentinel creates its file as it starts to watch.
        deadline = time.monotonic() + 30
        while not self.path.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the host-stall sentinel did not start ({self.path})")
            time.sleep(0.02)

    def stop(self) -> list[HostStall]:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None
        return read_stalls(self.path)


def read_stalls(path: Path) -> list[HostStall]:
    if not path.exists():
        return []
    stalls = []
    for line in path.read_text().splitlines():
        start, end = line.split()
        stalls.append(HostStall(float(start), float(end)))
    return stalls
