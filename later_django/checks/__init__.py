"""System checks for the LATER settings; every ID is listed in docs/reference/checks.md.

``check_settings`` runs each concern's checks: the values (values.py), the
database (database.py), what LATER names (topics_and_queues.py) and its
import paths (imports.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register

from later_django.checks.database import check_database
from later_django.checks.imports import check_context, check_jobs_module
from later_django.checks.messages import error
from later_django.checks.topics_and_queues import (
    check_queues,
    check_retained_log_lag,
    check_topics,
)
from later_django.checks.values import check_values, check_workers, unknown_keys_hint
from later_django.conf import DEFAULTS

__all__ = ["check_settings"]


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "LATER", {})
    if not isinstance(raw, dict):
        return [error("E001", "LATER must be a dict.", "Set LATER = {...} in settings.")]
    merged = {**DEFAULTS, **raw}
    messages: list[CheckMessage] = []
    # repr() for a key that is not a string (LATER = {1: 2}), so it is named too.
    unknown = sorted(key if isinstance(key, str) else repr(key) for key in set(raw) - set(DEFAULTS))
    if unknown:
        messages.append(
            Warning(
                f"LATER has unknown keys: {', '.join(unknown)}.",
                hint=unknown_keys_hint(unknown),
                id="later.W001",
            )
        )
    messages += check_workers(merged)
    messages += check_database(merged)
    messages += check_topics(merged["TOPICS"])
    messages += check_values(merged)
    messages += check_context(merged["CONTEXT"])
    messages += check_jobs_module(merged["JOBS_MODULE"], explicit="JOBS_MODULE" in raw)
    messages += check_retained_log_lag(merged["RETAINED_LOG_LAG"])
    messages += check_queues(merged["QUEUES"])
    return messages
