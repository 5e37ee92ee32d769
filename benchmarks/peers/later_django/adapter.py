"""later_django in the peer harness: enqueue through the public API, drain with later_worker."""

from __future__ import annotations

import os
import sys

from adapterbase import Adapter as Base


class Adapter(Base):
    name = "later_django"
    packages = ("later_django", "django", "psycopg")
    worker_note = (
        "1 `manage.py later_worker --workers N` process (N asyncio workers, async "
        "no-op handler), LISTEN/NOTIFY wake-ups, --verbosity 0"
    )
    bulk_note = "later_django.enqueue_many (one COPY per call, rows streamed while encoded)"

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        os.environ["DJANGO_SETTINGS_MODULE"] = "later_bench_settings"
        import django

        django.setup()
        from lbench.jobs import BenchNoop

        import later_django

        self.later = later_django
        self.payload = BenchNoop

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        call_command("later_migrate", verbosity=0)

    def reset(self) -> None:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("TRUNCATE later_job")

    def enqueue_one(self, n: int, t_enq: float) -> None:
        self.later.enqueue(self.payload(n=n, t=t_enq))

    def enqueue_bulk(self, items: list[tuple[int, float]]) -> None:
        self.later.enqueue_many([self.payload(n=n, t=t) for n, t in items])

    def start_workers(self, concurrency: int) -> None:
        # LBENCH_PROCESSES (N or "auto"): the total concurrency spread over
        # that many server processes under one later_worker (--processes).
        processes = os.environ.get("LBENCH_PROCESSES")
        spread = []
        if processes:
            count = (os.cpu_count() or 1) if processes == "auto" else int(processes)
            spread = [f"--processes={processes}"]
            concurrency = max(1, concurrency // count)
        self.spawn(
            [
                sys.executable,
                "-m",
                "django",
                "later_worker",
                *spread,
                f"--workers={concurrency}",
                "--verbosity=0",
            ]
        )

    def done_count(self) -> int:
        return int(self.later.stage_counts()["success"])

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
        super().close()
