"""Typed, lazy access to the ``LATER`` settings dict, with defaults.

Reads ``settings.LATER`` on first use and again after any settings change
(tests override it), so no other module touches the raw dict.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "NAMESPACE": "default",
    "WORKERS": 6,
    "AUTOSCALE": None,
    "DEFAULT_RETRY_COUNT": 6,
    "DEFAULT_RETRY_POLICY": None,
    "TOPICS": {},
    # Named queues and their options: {"default": {}, "emails": {}}
    # ("default" always exists; docs/how-to/queues.md).
    "QUEUES": {"default": {}},
    "RECURRING_SEQUENTIAL_PARTITIONS": None,
    "CONTEXT": None,
    "VACUUM_INTERVAL": None,
    "DASHBOARD_RETENTION": timedelta(days=1),
    "JOBS_MODULE": "jobs",
    "MAX_PAYLOAD_BYTES": 1 << 20,
    # PostgreSQL: plan later's own statements once per connection. Turn off
    # behind a pooler that cannot keep prepared statements (docs/reference/settings.md).
    "PREPARED_STATEMENTS": True,
    # OpenTelemetry: a span around each handler run, parented to the span
    # that enqueued the job (needs opentelemetry-api; docs/how-to/monitoring.md).
    "TRACING": False,
    # Tests and local development: run jobs in the enqueuing process when
    # their enqueue commits, with no worker (docs/how-to/testing.md).
    "RUN_INLINE": False,
    "LEASE_DURATION": timedelta(seconds=30),
    "STUCK_JOB_GRACE": timedelta(seconds=30),
    "MAINTENANCE_INTERVAL": timedelta(seconds=2),
    "POLL_INTERVAL": timedelta(milliseconds=100),
    "SUPERVISOR_INTERVAL": timedelta(seconds=30),
    "HUNG_WORKER_THRESHOLD": timedelta(minutes=5),
    "AUTOSCALE_INTERVAL": timedelta(seconds=15),
    "SHUTDOWN_TIMEOUT": timedelta(seconds=30),
    "PARTITION_HEARTBEAT_TTL": timedelta(seconds=15),
    "PARTITION_HEARTBEAT_INTERVAL": timedelta(seconds=5),
    "PARTITION_LEASE_DURATION": timedelta(seconds=30),
    "METRICS_REFRESH_INTERVAL": timedelta(seconds=5),
    "RETAINED_LOG_LEASE_DURATION": timedelta(seconds=30),
    # Retained-log topics whose consumer lag metrics and the dashboard
    # report: {"events": ["billing"], "audit": None} (None: every group).
    "RETAINED_LOG_LAG": {},
    # Recurring occurrences missed by less than this (downtime) still run;
    # of older ones only the latest runs, once (docs/how-to/recurring.md).
    "RECURRING_MISSED_GRACE": timedelta(minutes=1),
}

_TIMEDELTA_KEYS = {key for key, value in DEFAULTS.items() if isinstance(value, timedelta)}
TIMING_KEYS = frozenset(_TIMEDELTA_KEYS | {"VACUUM_INTERVAL"})


class Settings:
    """One attribute per key of ``LATER``; unknown keys raise AttributeError."""

    _cache: dict[str, Any] | None = None

    def raw(self) -> dict[str, Any]:
        """Return the user's LATER dict as given (for system checks)."""
        value = getattr(settings, "LATER", None)
        return value if isinstance(value, dict) else {}

    def merged(self) -> dict[str, Any]:
        if self._cache is None:
            self._cache = {**DEFAULTS, **self.raw()}
        return self._cache

    def clear(self) -> None:
        self._cache = None

    def __getattr__(self, key: str) -> Any:
        if key.isupper():
            try:
                return self.merged()[key]
            except KeyError:
                raise AttributeError(f"unknown LATER setting {key!r}") from None
        raise AttributeError(key)

    # Typed accessors for the keys the hot path reads.
    @property
    def database(self) -> str:
        return str(self.merged()["DATABASE"])

    @property
    def namespace(self) -> str:
        return str(self.merged()["NAMESPACE"])

    @property
    def prepared_statements(self) -> bool:
        return bool(self.merged()["PREPARED_STATEMENTS"])

    def seconds(self, key: str) -> float:
        """Return the timing setting ``key`` in seconds."""
        value = self.merged()[key]
        if isinstance(value, timedelta):
            return value.total_seconds()
        return float(value)

    def millis(self, key: str) -> int:
        """Return the timing setting ``key`` in whole milliseconds."""
        return int(self.seconds(key) * 1000)


conf = Settings()


@receiver(setting_changed)
def _clear_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "LATER":
        conf.clear()
