"""OpenTelemetry spans around handler runs, with LATER["TRACING"] on.

An enqueue inside a span records its context on the job; the worker runs
the handler in a span ``later.job <type>`` with that parent, so a request's
trace shows the jobs it started. Off, nothing here runs. Only
opentelemetry-api is imported: spans go wherever the application's SDK sends them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from later_django.conf import conf

TRACER_NAME = "later_django"


def enabled() -> bool:
    # Read on every enqueue: the merged dict, past the attribute lookup.
    return bool(conf.merged()["TRACING"])


def current_context() -> str | None:
    """The current span's context as JSON headers, or None outside a span."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, sort_keys=True) if "traceparent" in carrier else None


@contextlib.contextmanager
def job_span(*, job_id: str, job_type: str, attempt: int, context: str | None) -> Iterator[Any]:
    """A span around one handler run, child of the enqueuing span when
    ``context`` carries one; current while the handler runs."""
    from opentelemetry import propagate, trace

    parent = propagate.extract(json.loads(context)) if context else None
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"later.job {job_type}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "later",
            "messaging.operation": "process",
            "later.job.id": job_id,
            "later.job.type": job_type,
            "later.job.attempt": attempt,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def mark_outcome(span: Any, kind: str, exc: BaseException | None) -> None:
    """Record an attempt's outcome on its span: an error unless it succeeded."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("later.job.outcome", kind)
    if kind != "succeeded":
        if exc is not None:
            span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"attempt {kind}"))
