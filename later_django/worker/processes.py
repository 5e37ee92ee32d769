"""``later_worker --processes N``: N server processes under one parent.

One process runs Python on one core at a time; CPU-bound sync handlers need
more. The parent runs no server and touches no database after its start-up
checks: it starts N whole ``later_worker`` children, restarts one that dies,
passes SIGTERM/SIGINT on, and kills the ones still running past twice the
shutdown timeout plus STOP_GRACE_SECONDS. Children are new interpreters, not
forks (a fork would copy the parent's connections and threads), each in its
own process group (Ctrl-C reaches it once, through the parent), and die with
their parent (PR_SET_PDEATHSIG): a killed parent leaves no server unsupervised.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

logger = logging.getLogger("later_django.worker")

# A child that exits with an error (not a signal) within this long of its
# first start failed to start (bad settings, a database it cannot reach):
# the parent stops instead of restarting it for ever.
START_GRACE_SECONDS = 10.0
# Restarts of a child that keeps dying wait longer each time, up to this.
MAX_RESTART_DELAY = 30.0
# A child that ran this long is healthy again: its next restart is immediate.
HEALTHY_AFTER_SECONDS = 60.0
# Once stopping, children still running after twice the shutdown timeout
# plus this long are killed.
STOP_GRACE_SECONDS = 30.0
# A child's index (for its logs) and its parent's pid.
CHILD_INDEX_ENV = "LATER_WORKER_PROCESS"
PARENT_PID_ENV = "LATER_WORKER_PARENT"


def process_count(value: str) -> int:
    """``--processes``: a number >= 1, or ``auto`` for this machine's cores."""
    if value == "auto":
        if hasattr(os, "sched_getaffinity"):  # the cores this process may use
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--processes takes a number or auto, got {value!r}") from None
    if count < 1:
        raise ValueError(f"--processes must be at least 1, got {count}")
    return count


@dataclasses.dataclass
class Child:
    """One child slot: its process now, and how its restarts go."""

    index: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    starts: int = 0
    restart_at: float | None = None
    delay: float = 1.0


class Parent:
    """Start, watch and stop the children; ``run()`` returns the exit code.

    Everything is done by ``run()``, on the main thread: the signal handler
    and the threads that wait for the children only post what happened. So
    a stop never interleaves with a child's start: a signal that arrives
    while a child starts is acted on once it has started, and goes to it
    too; once stopping, no child is started again."""

    def __init__(
        self, child_argvs: Sequence[list[str]], env: dict[str, str], *, shutdown_timeout: float
    ) -> None:
        self.children = [Child(index, argv) for index, argv in enumerate(child_argvs)]
        self.env = env
        # What happened: a signal's number, or None for a child that exited.
        # A SimpleQueue's put() may interrupt its own get() (a signal handler
        # runs between two steps of the main thread): no lock to deadlock on.
        self.events: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.stopping = False
        # How long the children get to stop: the bound a process manager is
        # told to give a drain (docs/how-to/deploying.md).
        self.stop_within = 2 * shutdown_timeout + STOP_GRACE_SECONDS
        self.stop_deadline: float | None = None

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        for child in self.children:
            self._start(child)
        logger.info(
            "started %d worker processes: %s",
            len(self.children),
            ", ".join(str(c.proc.pid) for c in self.children if c.proc),
            extra={"action": "processes_started"},
        )
        code = 0
        while True:
            self._wait()
            failed = self._reap()
            if failed is not None and not self.stopping:
                logger.error(
                    "worker process %d exited with code %s within %gs of its start; "
                    "stopping the others (see its output above)",
                    failed.index,
                    failed.proc.returncode if failed.proc else None,
                    START_GRACE_SECONDS,
                    extra={"action": "process_failed_to_start"},
                )
                code = failed.proc.returncode if failed.proc else 1
                self._stop_all(signal.SIGTERM)
            if self.stopping:
                if not self._running():
                    return code
                if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
                    self._kill_running()
                    return code or 1
                continue
            self._restart_due()

    # -- signals -------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        self.events.put(signum)

    def _wait(self) -> None:
        """Wait for something to happen (a signal, a child's exit, a restart
        due, the stop's deadline); pass every signal received on."""
        try:
            event = self.events.get(timeout=self._next_timeout())
        except queue.Empty:
            return
        while True:
            if event is not None:
                # Each signal goes on to every child, which counts it as its
                # own: the first drains, the second hurries, the third exits.
                logger.info(
                    "received %s: passing it on to worker processes %s",
                    signal.Signals(event).name,
                    ", ".join(str(proc.pid) for _, proc in self._running()) or "none",
                    extra={"action": "processes_signalled"},
                )
                self._stop_all(signal.Signals(event))
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _stop_all(self, signum: signal.Signals) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_deadline = time.monotonic() + self.stop_within
        for _, proc in self._running():
            proc.send_signal(signum)

    def _kill_running(self) -> None:
        """Kill the children still running at the stop's deadline."""
        for child, proc in self._running():
            logger.error(
                "worker process %d (pid %d) did not stop within %gs of the stop; "
                "killing it (SIGKILL): leases recover its running jobs",
                child.index,
                proc.pid,
                self.stop_within,
                extra={"action": "process_killed"},
            )
            proc.kill()
            proc.wait()

    # -- children --------------------------------------------------------------------------
    def _running(self) -> list[tuple[Child, subprocess.Popen[bytes]]]:
        """The children that run now, each with its process."""
        return [
            (child, child.proc)
            for child in self.children
            if child.proc is not None and child.proc.poll() is None
        ]

    def _start(self, child: Child) -> None:
        env = {**self.env, CHILD_INDEX_ENV: str(child.index), PARENT_PID_ENV: str(os.getpid())}
        # Each child leads its own process group: a terminal's Ctrl-C signals
        # the foreground group, and a child in it would get SIGINT twice (the
        # terminal's and the parent's) and take the second as "hurry". The
        # death signal set in die_with_parent() does not depend on the group.
        child.proc = subprocess.Popen(child.argv, env=env, process_group=0)
        child.started_at = time.monotonic()
        child.starts += 1
        child.restart_at = None
        threading.Thread(
            target=self._wait_for,
            args=(child.proc,),
            name=f"later-child-{child.index}",
            daemon=True,
        ).start()

    def _wait_for(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self.events.put(None)

    def _reap(self) -> Child | None:
        """Schedule the restart of every child that exited; return one that
        failed to start, if any."""
        now = time.monotonic()
        for child in self.children:
            proc = child.proc
            if proc is None or proc.poll() is None or child.restart_at is not None:
                continue
            if self.stopping:
                continue
            ran = now - child.started_at
            if child.starts == 1 and ran < START_GRACE_SECONDS and proc.returncode > 0:
                return child
            if ran >= HEALTHY_AFTER_SECONDS:
                child.delay = 1.0
            logger.warning(
                "worker process %d (pid %d) exited with code %s after %.0fs; restarting it in %gs",
                child.index,
                proc.pid,
                proc.returncode,
                ran,
                child.delay,
                extra={"action": "process_restart"},
            )
            child.restart_at = now + child.delay
            child.delay = min(child.delay * 2, MAX_RESTART_DELAY)
        return None

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None and child.restart_at <= now:
                self._start(child)

    def _next_timeout(self) -> float | None:
        """Seconds until the stop's deadline, or the next restart due."""
        if self.stop_deadline is not None:
            return max(0.0, self.stop_deadline - time.monotonic())
        due = [c.restart_at for c in self.children if c.restart_at is not None]
        return None if not due else max(0.0, min(due) - time.monotonic())


def die_with_parent() -> None:
    """In a child, first thing: receive SIGKILL when the parent dies (Linux;
    elsewhere a child outlives a killed parent until it is stopped). A
    parent that died before this ran is noticed by its pid: exit then."""
    parent = os.environ.get(PARENT_PID_ENV)
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):
        os._exit(1)


def child_env() -> dict[str, str]:
    """The children's environment: this one, with this process's import
    path, so a child finds the project's settings wherever it was started."""
    paths = [os.getcwd() if entry == "" else entry for entry in sys.path]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
