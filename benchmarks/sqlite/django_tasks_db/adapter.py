"""django-tasks-db on SQLite: Django 5.2 + the django-tasks backport, ORM database backend."""

from __future__ import annotations

import os
import sys

from adapterbase import Adapter as Base
from sqlitebench import delete_all


class Adapter(Base):
    name = "django_tasks_db"
    packages = ("django", "django-tasks", "django-tasks-db")
    worker_note = (
        "N `manage.py db_worker` processes (it runs one task at a time, no concurrency "
        "option; claims in BEGIN EXCLUSIVE on SQLite); defaults (--interval 1 s poll), "
        "--verbosity=0"
    )

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        os.environ["DJANGO_SETTINGS_MODULE"] = "dtdb_sqlite_settings"
        import django

        django.setup()
        import dtdb_sqlite_tasks
        from django_tasks_db.models import DBTaskResult

        self.task, self.model = dtdb_sqlite_tasks.noop, DBTaskResult

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def reset(self) -> None:
        delete_all(self.model._meta.db_table)

    def enqueue_one(self, n: int, t_enq: float) -> None:
        self.task.enqueue(n, t_enq)

    def start_workers(self, concurrency: int) -> None:
        for i in range(concurrency):
            self.spawn([sys.executable, "-m", "django", "db_worker", "--verbosity=0"], tag=f"w{i}")

    def done_count(self) -> int:
        return int(self.model.objects.successful().count())

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
