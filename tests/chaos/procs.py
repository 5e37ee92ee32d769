"""The ``later_worker`` processes of a chaos run: start, kill, pause, stop.

Only processes this module started are ever signalled, by their PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]


@dataclass
class Life:
    """One worker process: which slot it filled, when, and how it ended."""

    slot: int
    pid: int
    started: float
    log: Path
    ended: float | None = None
    end_reason: str = ""  # killed (a fault) | stopped (end of run) | exited (by itself!)
    exit_code: int | None = None


class WorkerPool:
    """``count`` slots, each running one ``later_worker`` process at a time."""

    def __init__(
        self, count: int, workers: int, env: dict[str, str], log_dir: Path, processes: int = 1
    ) -> None:
        self.count = count
        self.workers = workers
        # Each slot's later_worker --processes: its children share its fate,
        # since every signal goes to the slot's process group.
        self.processes = processes
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.current: dict[int, Life] = {}
        self.lives: list[Life] = []
        self.paused: set[int] = set()
        self.lock = threading.Lock()

    def start(self, slot: int) -> Life:
        index = sum(1 for life in self.lives if life.slot == slot)
        log = self.log_dir / f"worker-{slot}-{index}.log"
        argv = [
            sys.executable,
            "-m",
            "django",
            "later_worker",
            "--workers",
            str(self.workers),
            "-v",
            "1",
            *(["--processes", str(self.processes)] if self.processes > 1 else []),
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=PROJECT_DIR,
                env={**self.env, "CHAOS_ROLE": "worker"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        life = Life(slot=slot, pid=proc.pid, started=time.time(), log=log)
        with self.lock:
            self.procs[slot] = proc
            self.current[slot] = life
            self.lives.append(life)
        return life

    def start_all(self) -> None:
        for slot in range(self.count):
            self.start(slot)

    def alive_slots(self) -> list[int]:
        with self.lock:
            return [s for s, p in self.procs.items() if p.poll() is None]

    def pid_of(self, slot: int) -> int:
        return self.current[slot].pid

    def slot_of_pid(self, pid: int) -> int | None:
        with self.lock:
            for slot, life in self.current.items():
                if life.pid == pid and self.procs[slot].poll() is None:
                    return slot
        return None

    def kill(self, slot: int) -> int:
        """SIGKILL the slot's process and wait for it; return its PID."""
        proc = self.procs[slot]
        life = self.current[slot]
        # The slot's process group: the process and, with --processes, its
        # children (started in a session of its own, the group is its pid).
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(30)
        life.ended, life.end_reason, life.exit_code = time.time(), "killed", code
        return proc.pid

    def pause(self, slot: int) -> int:
        pid = self.procs[slot].pid
        os.killpg(pid, signal.SIGSTOP)
        self.paused.add(pid)
        return pid

    def resume(self, pid: int) -> None:
        os.killpg(pid, signal.SIGCONT)
        self.paused.discard(pid)

    def check_exits(self) -> list[Life]:
        """Lives that ended without being killed or stopped by the run."""
        gone = []
        with self.lock:
            for slot, proc in self.procs.items():
                life = self.current[slot]
                code = proc.poll()
                if code is not None and life.ended is None:
                    life.ended, life.end_reason, life.exit_code = time.time(), "exited", code
                    gone.append(life)
        return gone

    def stop_all(self, timeout: float = 20.0) -> list[Life]:
        """SIGTERM every live process, SIGKILL past ``timeout``; return the
        lives that needed SIGKILL."""
        self.check_exits()
        for pid in list(self.paused):
            self.resume(pid)
        live = [(s, p) for s, p in self.procs.items() if p.poll() is None]
        for _, proc in live:
            proc.send_signal(signal.SIGTERM)
        forced = []
        deadline = time.monotonic() + timeout
        for slot, proc in live:
            life = self.current[slot]
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                code = proc.wait(30)
                forced.append(life)
            life.ended, life.end_reason, life.exit_code = time.time(), "stopped", code
        return forced
