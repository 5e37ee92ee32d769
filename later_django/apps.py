"""The Django app: registers system checks and discovers jobs modules."""

from __future__ import annotations

from django.apps import AppConfig


class LaterDjangoConfig(AppConfig):
    name = "later_django"
    label = "later_django"
    verbose_name = "later"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from later_django import (
            checks,  # noqa: F401  (registers the checks)
            inline,
        )
        from later_django.conf import conf
        from later_django.registry import autodiscover, is_module_name
        from later_django.signals import reinstall_triggers

        post_migrate.connect(reinstall_triggers, sender=self)

        # Every worker server of this process records its figures for the
        # dashboard, through the server's extension seam.
        from later_django.dashboard.recorder import FigureWriter
        from later_django.worker import extensions

        extensions.register(FigureWriter)

        # Like admin.py: every installed app's jobs module registers its
        # handlers. A value that is no module name is left to later.E019.
        if is_module_name(conf.JOBS_MODULE):
            autodiscover(conf.JOBS_MODULE)

        # Task jobs are named by their task's path: workers find their
        # handlers through the Tasks backend, when a TASKS entry uses it.
        from django.conf import settings

        backends = getattr(settings, "TASKS", None) or {}
        if any(
            str(entry.get("BACKEND", "")) == "later_django.tasks.LaterBackend"
            for entry in backends.values()
            if isinstance(entry, dict)
        ):
            from later_django import registry
            from later_django.tasks import backend

            registry.add_resolver(backend.resolve)

        # LATER["RUN_INLINE"]: listen for commits now, and again whenever
        # a test overrides the setting.
        inline.sync_with_settings()

        # A web process that serves django-prometheus's /metrics shows
        # later's too (later_worker serves its own with --metrics-port).
        from django.apps import apps

        if apps.is_installed("django_prometheus"):
            from later_django import metrics

            metrics.install_for_web(conf.seconds("METRICS_REFRESH_INTERVAL"))
