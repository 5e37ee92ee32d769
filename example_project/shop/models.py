"""The shop's own data: orders, written in the same transaction as their jobs."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.IntegerField()
    paid = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.email}"
