"""Checks of the LATER values themselves: unknown keys, worker counts,
timings, retries, payload size and switches. None reads the database.
"""

from __future__ import annotations

import difflib
import importlib.util
from datetime import timedelta
from typing import Any

from django.core.checks import CheckMessage

from later_django.checks.messages import error
from later_django.conf import DEFAULTS, TIMING_KEYS
from later_django.retry import RetryPolicy

MAX_WORKERS = 255


def unknown_keys_hint(unknown: list[str]) -> str:
    """Suggest the known key nearest to each unknown one, if any is close."""
    # Compared in upper case: every known key is, and "workers" is a misspelling too.
    guesses = {
        key: close[0]
        for key in unknown
        if (close := difflib.get_close_matches(key.upper(), DEFAULTS, n=1))
    }
    if len(unknown) == 1:
        if guesses:
            return (
                f"Did you mean {guesses[unknown[0]]}? Otherwise remove it; "
                "see docs/reference/settings.md."
            )
        return "Remove it or fix its spelling; see docs/reference/settings.md."
    if not guesses:
        return "Remove them or fix their spelling; see docs/reference/settings.md."
    named = ", ".join(f"{guess} (for {key})" for key, guess in guesses.items())
    return (
        f"Did you mean {named}? Otherwise remove them or fix their spelling; "
        "see docs/reference/settings.md."
    )


def check_workers(merged: dict[str, Any]) -> list[CheckMessage]:
    workers = merged["WORKERS"]
    messages: list[CheckMessage] = []
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        messages.append(
            error(
                "E002",
                f"LATER['WORKERS'] is {workers!r}; it must be an int from 1 to {MAX_WORKERS}.",
                "Set LATER['WORKERS'] to the number of jobs one process runs at once, e.g. 6.",
            )
        )
    autoscale = merged["AUTOSCALE"]
    if autoscale is not None:
        ok = (
            isinstance(autoscale, (tuple, list))
            and len(autoscale) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in autoscale)
        )
        if not ok or not 1 <= autoscale[0] <= autoscale[1] <= MAX_WORKERS:
            messages.append(
                error(
                    "E003",
                    f"LATER['AUTOSCALE'] is {autoscale!r}; it must be (min, max) with "
                    f"1 <= min <= max <= {MAX_WORKERS}.",
                    "Set LATER['AUTOSCALE'] = (2, 16), or None to keep WORKERS fixed.",
                )
            )
    return messages


def check_values(merged: dict[str, Any]) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for key in sorted(TIMING_KEYS):
        value = merged[key]
        if key == "VACUUM_INTERVAL" and value is None:
            continue
        if not isinstance(value, timedelta) or value <= timedelta(0):
            messages.append(
                error(
                    "E010",
                    f"LATER[{key!r}] is {value!r}; it must be a positive timedelta.",
                    f"Set LATER[{key!r}] = timedelta(seconds=...).",
                )
            )
    count = merged["DEFAULT_RETRY_COUNT"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        messages.append(
            error(
                "E011",
                f"LATER['DEFAULT_RETRY_COUNT'] is {count!r}; it must be an int >= 0.",
                "Set it to the number of retries after the first attempt, e.g. 6.",
            )
        )
    policy = merged["DEFAULT_RETRY_POLICY"]
    if policy is not None and not isinstance(policy, RetryPolicy):
        kind = type(policy).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        messages.append(
            error(
                "E012",
                f"LATER['DEFAULT_RETRY_POLICY'] is {article} {kind}; it must "
                "be a RetryPolicy or None.",
                "Use RetryPolicy.fixed(3, timedelta(seconds=5)).",
            )
        )
    limit = merged["MAX_PAYLOAD_BYTES"]
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        messages.append(
            error(
                "E013",
                f"LATER['MAX_PAYLOAD_BYTES'] is {limit!r}; it must be an int >= 1.",
                "Leave the default (1 MiB) or set a positive byte count.",
            )
        )
    prepared = merged["PREPARED_STATEMENTS"]
    if not isinstance(prepared, bool):
        messages.append(
            error(
                "E016",
                f"LATER['PREPARED_STATEMENTS'] is {prepared!r}; it must be True or False.",
                "Leave it True, or set False behind a pooler that cannot keep "
                "prepared statements (PgBouncer in transaction mode before 1.21).",
            )
        )
    messages += check_tracing(merged["TRACING"])
    run_inline = merged["RUN_INLINE"]
    if not isinstance(run_inline, bool):
        messages.append(
            error(
                "E023",
                f"LATER['RUN_INLINE'] is {run_inline!r}; it must be True or False.",
                "Set LATER['RUN_INLINE'] = True in test settings to run jobs when their "
                "enqueue commits, or leave the key out.",
            )
        )
    partitions = merged["RECURRING_SEQUENTIAL_PARTITIONS"]
    if partitions is not None and (
        not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1
    ):
        messages.append(
            error(
                "E014",
                f"LATER['RECURRING_SEQUENTIAL_PARTITIONS'] is {partitions!r}; it must "
                "be None or an int >= 1.",
                "Set it to a partition count such as 4.",
            )
        )
    return messages


def check_tracing(tracing: object) -> list[CheckMessage]:
    if not isinstance(tracing, bool):
        return [
            error(
                "E020",
                f"LATER['TRACING'] is {tracing!r}; it must be True or False.",
                "Set True to trace each job's run with OpenTelemetry, else leave it out.",
            )
        ]
    if tracing and importlib.util.find_spec("opentelemetry") is None:
        return [
            error(
                "E021",
                "LATER['TRACING'] is True but opentelemetry-api is not installed.",
                'pip install "later-django[tracing]" (and an OpenTelemetry SDK and '
                "exporter), or set LATER['TRACING'] = False.",
            )
        ]
    return []
