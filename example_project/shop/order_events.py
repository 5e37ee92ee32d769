"""The shop's order events on a retained log: appended in the transaction that
places an order, read back by an "analytics" consumer group.

A record's key is the customer's e-mail, so one customer's events stay in
order in one partition.
"""

from __future__ import annotations

import json
from datetime import timedelta

from later_django import retained_log as log
from shop.models import Order

TOPIC = "order-events"
PARTITIONS = 4
# Deleted by later_worker's maintenance after this long.
RETENTION = timedelta(days=30)


def register() -> None:
    """Idempotent: safe to call on every start."""
    log.register_topic(TOPIC, partitions=PARTITIONS, retention=RETENTION)


def order_placed(order: Order) -> tuple[int, int]:
    """Append the event inside the caller's transaction: it exists only if
    the order does."""
    event = {"event": "order_placed", "order": order.pk, "total_cents": order.total_cents}
    return log.append(TOPIC, key=order.email, value=json.dumps(event).encode())


class Revenue:
    """A consumer handler: sums the totals of the events it is handed."""

    def __init__(self) -> None:
        self.orders = 0
        self.cents = 0

    def __call__(self, record: log.Record) -> None:
        event = json.loads(record.value)
        if event["event"] == "order_placed":
            self.orders += 1
            self.cents += event["total_cents"]


def replay_revenue(group: str = "analytics") -> Revenue:
    """Run the ``group`` consumer over every event it has not committed yet."""
    revenue = Revenue()
    log.consume(TOPIC, group=group, member="demo", handler=revenue, until_idle=True)
    return revenue
