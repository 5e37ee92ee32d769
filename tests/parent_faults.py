"""``later_worker`` run in a process whose ``--processes`` parent meets a
fault of the test's choice (tests/worker/test_worker_process_pool.py):

    python -m tests.parent_faults FAULT later_worker-options...

The parent and its children are real processes on the test database; only
the parent's timing is bent, so a race that real signals hit now and then
is hit every time:

- ``signal-in-restart``: the parent sends itself SIGTERM as it starts a
  child again, as a stop that arrives while a dead child is replaced;
- ``short-stop-grace``: the children get 1 s beyond twice the shutdown
  timeout to stop, not 30 s.
"""

from __future__ import annotations

import os
import signal
import sys

import django


def signal_in_restart() -> None:
    from later_django.worker import processes

    start = processes.Parent._start

    def restart_signalled(self: processes.Parent, child: processes.Child) -> None:
        if child.starts:  # a restart: the stop arrives in the middle of it
            os.kill(os.getpid(), signal.SIGTERM)
        start(self, child)

    processes.Parent._start = restart_signalled  # type: ignore[method-assign]


def short_stop_grace() -> None:
    from later_django.worker import processes

    processes.STOP_GRACE_SECONDS = 1.0


FAULTS = {"signal-in-restart": signal_in_restart, "short-stop-grace": short_stop_grace}


def main() -> None:
    fault, *options = sys.argv[1:]
    django.setup()
    FAULTS[fault]()
    from django.core.management import call_command

    call_command("later_worker", *options)


if __name__ == "__main__":
    main()
