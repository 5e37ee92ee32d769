"""later_django as Django 6.1's django.tasks backend, drained by later_worker."""

from __future__ import annotations

import os
import sys

from adapterbase import Adapter as Base


class Adapter(Base):
    name = "later_django_tasks"
    packages = ("later_django", "django", "psycopg")
    worker_note = (
        "1 `manage.py later_worker --workers N` process (N asyncio workers; the task "
        "is a sync function, so it runs in later's handler threads), LISTEN/NOTIFY "
        "wake-ups, --verbosity 0"
    )

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        os.environ["DJANGO_SETTINGS_MODULE"] = "ltasks_settings"
        import django

        django.setup()
        import ltasks_tasks

        import later_django

        self.later = later_django
        self.task = ltasks_tasks.noop

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        call_command("later_migrate", verbosity=0)

    def reset(self) -> None:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("TRUNCATE later_job, later_task_result")

    def enqueue_one(self, n: int, t_enq: float) -> None:
        self.task.enqueue(n, t_enq)

    def start_workers(self, concurrency: int) -> None:
        self.spawn(
            [sys.executable, "-m", "django", "later_worker", f"--workers={concurrency}",
             "--verbosity=0"]
        )  # fmt: skip

    def done_count(self) -> int:
        return int(self.later.stage_counts()["success"])

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
        super().close()
