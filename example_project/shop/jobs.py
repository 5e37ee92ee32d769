"""The shop's background jobs: payloads are dataclasses, handlers are @job functions."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from later_django import JobContext, RetryPolicy, job
from shop.models import Order

logger = logging.getLogger(__name__)


@dataclass
class ChargeCard:
    order_id: int


@job(atomic=True, retry=RetryPolicy.fixed(3, timedelta(seconds=1)))
def charge_card(ctx: JobContext, payload: ChargeCard) -> None:
    """A sync handler: runs in a worker thread and may use the ORM freely.
    Atomic: the order is marked paid in the same commit as the job's
    success, so a failed or interrupted attempt never leaves it paid."""
    Order.objects.filter(pk=payload.order_id).update(paid=True)


@dataclass
class SendReceipt:
    order_id: int
    email: str


@job(queue="emails", unique_key=lambda payload: f"receipt-{payload.order_id}")
async def send_receipt(ctx: JobContext, payload: SendReceipt) -> None:
    """An async handler: runs on the worker's event loop. On the "emails"
    queue (LATER["QUEUES"] in settings): `later_worker --queues emails=2`
    would give mail its own workers; the demo's worker serves every queue.
    One receipt per order: while one is unfinished, enqueueing another
    returns its id and writes nothing (a double-clicked "resend")."""
    await asyncio.sleep(0.05)  # stands in for an HTTP call to a mail service


@dataclass
class NotifyWarehouse:
    order_id: int
    fail_attempts: int = 1


# The warehouse's API takes two calls at a time, whatever the number of
# workers (docs/how-to/concurrency-limits.md).
@job(retry=RetryPolicy.fixed(3, timedelta(milliseconds=500)), concurrency=2)
def notify_warehouse(ctx: JobContext, payload: NotifyWarehouse) -> None:
    """Fails its first attempt(s), as a flaky remote API would; retries heal it."""
    if ctx.attempt <= payload.fail_attempts:
        raise ConnectionError(f"warehouse API timed out (attempt {ctx.attempt})")


@dataclass
class CloseOrder:
    order_id: int


@job
def close_order(ctx: JobContext, payload: CloseOrder) -> None:
    """A fan-in job: runs once, after the receipt went out and the warehouse
    was told, however many attempts each of them took."""


@dataclass
class AskForReview:
    order_id: int


@job
def ask_for_review(ctx: JobContext, payload: AskForReview) -> None:
    """Sent a little after the order, as a delayed job."""


@dataclass
class CancelledCoupon:
    code: str


@job
def apply_coupon(ctx: JobContext, payload: CancelledCoupon) -> None:
    raise AssertionError("this job is cancelled before it can run")


@dataclass
class SalesReport:
    period: str


@job
def sales_report(ctx: JobContext, payload: SalesReport) -> None:
    """A recurring job: enqueue_recurring runs it at every fire time of a cron."""
    paid = Order.objects.filter(paid=True).count()
    logger.info("sales report (%s): %d paid orders", payload.period, paid)


@dataclass
class LedgerEntry:
    """A line of a customer's ledger. Lines of one customer must be posted in
    the order they were written, one at a time: the "ledger" topic (see
    LATER["TOPICS"] in settings) runs them in enqueue order per partition,
    and partition_key() puts every line of a customer in one partition."""

    customer: str
    order_id: int
    what: str
    cents: int
    fail_first: bool = False

    def partition_key(self) -> str:
        return self.customer


@job(topic="ledger", retry=RetryPolicy.fixed(3, timedelta(milliseconds=300)))
async def post_ledger_entry(ctx: JobContext, payload: LedgerEntry) -> None:
    """A failed attempt is retried in its place: the lines after it wait."""
    await asyncio.sleep(0.05)  # stands in for a call to the accounting system
    if payload.fail_first and ctx.attempt == 1:
        raise ConnectionError("accounting system busy; retried before the next line")
