"""huey with its SQLite storage (SqliteHuey) and one thread-worker consumer."""

from __future__ import annotations

import sys

from adapterbase import Adapter as Base


class Adapter(Base):
    name = "huey"
    packages = ("huey",)
    worker_note = (
        "1 `huey_consumer -k thread -w N` process (N worker threads, which share the "
        "storage's one connection behind a lock); defaults (poll 0.1 s backing off "
        "x1.15 to 10 s when idle), -q (WARNING)"
    )

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        import hbench_tasks

        self.huey, self.task = hbench_tasks.huey, hbench_tasks.noop

    def reset(self) -> None:
        self.huey.flush()

    def enqueue_one(self, n: int, t_enq: float) -> None:
        self.task(n, t_enq)

    def start_workers(self, concurrency: int) -> None:
        self.spawn(
            [
                sys.executable,
                self.bin("huey_consumer"),
                "hbench_tasks.huey",
                "-k",
                "thread",
                "-w",
                str(concurrency),
                "-q",
            ]
        )

    def close(self) -> None:
        self.huey.storage.close()
