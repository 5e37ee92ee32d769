"""later_django on SQLite: the PostgreSQL harness adapter's calls, on a SQLite file."""

from __future__ import annotations

import os
import sys

from adapterbase import Adapter as Base
from sqlitebench import delete_all

# The no-op job (the lbench app) is shared with the PostgreSQL adapter.
JOBS_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "peers", "later_django"
)


class Adapter(Base):
    name = "later_django"
    packages = ("later-django", "django")
    worker_note = (
        "1 `manage.py later_worker --workers N` process (N asyncio workers, async "
        "no-op handler), wakes on other processes' commits (PRAGMA data_version, checked "
        "every 4 ms), --verbosity 0"
    )
    bulk_note = "later_django.enqueue_many (multi-row INSERTs of 1,000 rows)"

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        jobs_dir = os.path.normpath(JOBS_DIR)
        sys.path.insert(0, jobs_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [jobs_dir, os.environ.get("PYTHONPATH")])
        )
        os.environ["DJANGO_SETTINGS_MODULE"] = "later_sqlite_settings"
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
        # Row triggers keep the stage counters right while the jobs go.
        delete_all("later_job")

    def enqueue_one(self, n: int, t_enq: float) -> None:
        self.later.enqueue(self.payload(n=n, t=t_enq))

    def enqueue_bulk(self, items: list[tuple[int, float]]) -> None:
        self.later.enqueue_many([self.payload(n=n, t=t) for n, t in items])

    def start_workers(self, concurrency: int) -> None:
        self.spawn(
            [
                sys.executable,
                "-m",
                "django",
                "later_worker",
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
