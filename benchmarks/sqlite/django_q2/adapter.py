"""django-q2 on SQLite, with the Django ORM broker."""

from __future__ import annotations

import os
import sys

from adapterbase import Adapter as Base
from sqlitebench import delete_all


class Adapter(Base):
    name = "django_q2"
    packages = ("django", "django-q2")
    worker_note = (
        "1 `manage.py qcluster` with Q_CLUSTER workers=N (N worker processes, plus its "
        "pusher/monitor/sentinel); ORM broker, defaults (poll 0.2 s, bulk 1), save_limit=0"
    )

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        os.environ["DJANGO_SETTINGS_MODULE"] = "dq2_sqlite_settings"
        import django

        django.setup()
        from django_q.models import OrmQ, Success
        from django_q.tasks import async_task

        self.async_task, self.OrmQ, self.Success = async_task, OrmQ, Success

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def reset(self) -> None:
        delete_all(self.OrmQ._meta.db_table, self.Success._meta.db_table)

    def enqueue_one(self, n: int, t_enq: float) -> None:
        self.async_task("dq2_sqlite_tasks.noop", n, t_enq)

    def start_workers(self, concurrency: int) -> None:
        os.environ["BENCH_DQ2_WORKERS"] = str(concurrency)
        self.spawn([sys.executable, "-m", "django", "qcluster"])

    def done_count(self) -> int:
        return int(self.Success.objects.count())

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
