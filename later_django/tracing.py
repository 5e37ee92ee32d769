"""OpenTelemetry spans around handler runs, with LATER["TRACING"] on.

An enqueue made inside a span records that span's context on the job (W3C
trace-context headers, as JSON); the worker then runs the handler inside a
span ``later.job <type>`` whose parent is that span, so a request's trace
shows the jobs it started. Off by default; with it off nothing here runs
and jobs pay nothing. Only opentelemetry-api is imported: spans go wherever
the application's SDK sends them (no SDK, no spans).
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
