"""``manage.py demo``: place an order, run a worker until its jobs finish, show them."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

import later_django as later
from later_django.dashboard import reads
from later_django.states import TERMINAL
from shop import order_events
from shop.jobs import (
    AskForReview,
    CancelledCoupon,
    ChargeCard,
    CloseOrder,
    LedgerEntry,
    NotifyWarehouse,
    SalesReport,
    SendReceipt,
)
from shop.models import Order
from shop.tasks import order_total

DEADLINE_SECONDS = 60


def manage_py(command: str) -> str:
    """Return the shell command that runs ``manage.py command`` from the
    current directory with the Python running this demo, so a user in a
    virtualenv is not sent to the system's python."""
    if not sys.executable:
        python = "python"  # an embedded interpreter may not know its own path
    else:
        python = _as_typed(Path(sys.executable))
        if os.sep not in python:
            python = f".{os.sep}{python}"  # a bare name would be looked up on PATH
    return f"{python} {_as_typed(Path(settings.BASE_DIR) / 'manage.py')} {command}"


def _as_typed(path: Path) -> str:
    """``path`` relative to the current directory when it is under it, else as is."""
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


class Command(BaseCommand):
    help = "Enqueue a mix of jobs, run later_worker until they finish, print what happened."

    def handle(self, *args: Any, **options: Any) -> None:
        order_events.register()
        with transaction.atomic():
            # The order, its jobs and its event commit together, or not at all.
            order = Order.objects.create(email="ada@example.com", total_cents=4200)
            partition, offset = order_events.order_placed(order)
            charge = later.enqueue_in(ChargeCard(order_id=order.pk), priority=10)
            receipt = later.enqueue_continue(charge, SendReceipt(order.pk, order.email))
            # A second receipt for the order is a duplicate: the unique key
            # (shop/jobs.py) gives back the first one's id, writing nothing.
            resend = later.enqueue_continue(charge, SendReceipt(order.pk, order.email))
            warehouse = later.enqueue_continue(charge, NotifyWarehouse(order.pk))
            close = later.enqueue(CloseOrder(order.pk), after=[receipt, warehouse])
            review = later.enqueue_delayed(AskForReview(order.pk), timedelta(seconds=2))
            coupon = later.enqueue(CancelledCoupon(code="SPRING"))
            # A Django task (shop/tasks.py) joins the same transaction.
            total = order_total.enqueue(order.pk)
            # The customer's ledger lines: they run one at a time, in this
            # order, even though the first one fails once and is retried.
            ledger = [
                later.enqueue_to_partition_in(LedgerEntry(*line))
                for line in (
                    (order.email, order.pk, "order placed", order.total_cents, True),
                    (order.email, order.pk, "card charged", -order.total_cents),
                    (order.email, order.pk, "points earned", 42),
                )
            ]
        later.cancel(coupon)
        # Every 2 seconds (six fields: seconds first). Registering again with
        # the same cron only updates the payload, so this is safe on every run.
        later.remove_recurring("sales-report")
        report = later.enqueue_recurring("sales-report", SalesReport("2s"), "*/2 * * * * *")
        jobs = {
            "charge card (sync, atomic, priority 10)": charge,
            "send receipt (async continuation)": receipt,
            "notify warehouse (fails once, retried)": warehouse,
            "close order (fan-in: after receipt and warehouse)": close,
            "ask for review (delayed 2 s)": review,
            "apply coupon (cancelled)": coupon,
            "sales report (recurring, first occurrence)": report,
            "order total (a Django @task)": total.id,
        }
        self.stdout.write(
            f"enqueued {len(jobs) + len(ledger)} jobs for {order}; a second receipt was "
            f"{'a duplicate of ' + resend if resend.duplicate else 'written'}; starting "
            "later_worker"
        )

        worker = subprocess.Popen(
            [sys.executable, "manage.py", "later_worker", "--workers", "4"],
            cwd=settings.BASE_DIR,
            env=os.environ.copy(),
        )
        try:
            self._wait([*jobs.values(), *ledger])
            [schedule] = later.list_recurring()
            self.stdout.write(
                f"schedule {schedule.identifier!r} ({schedule.cron}, {schedule.zone}): "
                f"last occurrence {schedule.last_job_id} at {schedule.last_run_at:%H:%M:%S}, "
                f"next at {schedule.next_run_at:%H:%M:%S}"
            )
            later.remove_recurring("sales-report")
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=30)
        self._report(jobs)
        result = order_total.get_result(total.id)
        self.stdout.write(f"  task result: {result.status}, returned {result.return_value}")
        self._report_ledger(ledger)
        order.refresh_from_db()
        self.stdout.write(f"\n{order}: paid={order.paid}; worker exited with code {code}")
        self.stdout.write(f"stage counts: {later.stage_counts()}")
        revenue = order_events.replay_revenue()
        self.stdout.write(
            f"order event at {order_events.TOPIC}/{partition} offset {offset}; the "
            f"analytics group consumed {revenue.orders} new event(s), "
            f"{revenue.cents / 100:.2f} in total"
        )
        self._report_dashboard()

    def _report_dashboard(self) -> None:
        """What the admin dashboard's overview shows for this run, read as
        its JSON endpoint reads it."""
        overview = reads.overview()
        throughput, waits = overview["throughput"], overview["waits"]["regular"]
        self.stdout.write(
            f"dashboard: {throughput['stage_changes']} stage changes in the last "
            f"{throughput['window_seconds']} s; dispatch wait p50 "
            f"{waits['p50_ms'] if waits else '-'} ms, max {waits['max_ms'] if waits else '-'} ms"
            f"; database {overview['database_size_bytes'] // 1024} KiB\n"
            f"  see it live: {manage_py('createsuperuser')}, {manage_py('runserver')}, "
            "then http://127.0.0.1:8000/admin/later/"
        )

    def _wait(self, ids: Any) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            infos = [later.get_job(job_id) for job_id in ids]
            if all(info is not None and info.stage in TERMINAL for info in infos):
                return
            time.sleep(0.1)
        raise CommandError(f"jobs did not finish within {DEADLINE_SECONDS}s")

    def _report_ledger(self, ledger: list[str]) -> None:
        """Show that the ledger lines ran in enqueue order, one at a time."""
        infos = [later.get_job(job_id) for job_id in ledger]
        runs = []
        for info in infos:
            assert info is not None and info.finished_at is not None
            first_run = next(c.at for c in info.history if c.stage == "running")
            runs.append((info, first_run, info.finished_at))
        head, start = infos[0], runs[0][1]
        assert head is not None
        self.stdout.write(
            f"\nledger lines of {head.topic!r} partition {head.partition}, in enqueue order:"
        )
        for n, (info, began, ended) in enumerate(runs):
            self.stdout.write(
                f"  sequence {info.sequence}: {info.stage} after {info.attempts} attempt(s), "
                f"first run +{(began - start).total_seconds():.2f}s, "
                f"done +{(ended - start).total_seconds():.2f}s"
            )
            if n and began < runs[n - 1][2]:
                raise CommandError(f"ledger line {info.id} started before the one before it ended")
        for stats in later.partition_stats():
            if (stats.topic, stats.partition) == (head.topic, head.partition):
                self.stdout.write(
                    f"  each line started after the one before it finished; the partition "
                    f"has {stats.next_sequence} line(s), {stats.depth} unfinished"
                )

    def _report(self, jobs: dict[str, str]) -> None:
        for label, job_id in jobs.items():
            info = later.get_job(job_id)
            assert info is not None
            start = info.history[0].at
            steps = " -> ".join(
                f"{change.stage} (+{(change.at - start).total_seconds():.2f}s)"
                for change in info.history
            )
            self.stdout.write(
                f"\n{label}\n  id {info.id}: {info.stage}, {info.attempts} attempt(s)\n  {steps}"
            )
            if info.last_error:
                self.stdout.write(f"  last error: {info.last_error.splitlines()[0]}")
