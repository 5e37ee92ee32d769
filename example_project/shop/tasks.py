"""A Django task (django.tasks), run by later_worker through LaterBackend."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django_tasks backport
    from django_tasks import task

from shop.models import Order


@task
def order_total(order_id: int) -> dict[str, object]:
    order = Order.objects.get(pk=order_id)
    return {"order": order.pk, "total_cents": order.total_cents, "paid": order.paid}
