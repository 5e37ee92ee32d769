from __future__ import annotations

from django.apps import AppConfig


class ChaosConfig(AppConfig):
    name = "tests.chaos.app"
    label = "later_chaos"
    verbose_name = "later chaos workload"
