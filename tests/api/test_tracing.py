"""OpenTelemetry: with LATER["TRACING"], each handler run is a span whose
parent is the span that enqueued the job, current inside the handler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import later_django as later
from tests.helpers import await_stage, read_records, serve, set_later
from tests.jobapp.jobs import AsyncTraceProbe, Noop, NoRetry, TraceProbe

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process: the first test sets it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def job_spans(exporter: InMemorySpanExporter) -> dict[str, Any]:
    return {
        str(span.attributes["later.job.id"]): span
        for span in exporter.get_finished_spans()
        if span.name.startswith("later.job ")
    }


def test_a_jobs_run_continues_the_span_that_enqueued_it(later_db, record, settings, spans):
    set_later(settings, TRACING=True)
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request:
        sync_job = later.enqueue(TraceProbe(n=1))
        async_job = later.enqueue(AsyncTraceProbe(n=2))
        bulk = later.enqueue_many([Noop(n=3), Noop(n=4)])
    untraced = later.enqueue(NoRetry())  # outside any span
    done = [sync_job, async_job, *bulk]

    async def body(server: Any) -> None:
        for job_id in done:
            await await_stage(job_id, "success")
        await await_stage(untraced, "failed")

    serve(body, workers=2)
    ran = job_spans(spans)
    assert set(ran) == {*done, untraced}
    parent = request.get_span_context()
    for job_id in done:
        span = ran[job_id]
        assert span.parent is not None and span.parent.span_id == parent.span_id, job_id
        assert span.context.trace_id == parent.trace_id
        assert span.kind == trace.SpanKind.CONSUMER
        assert span.attributes["later.job.outcome"] == "succeeded"
        assert span.attributes["later.job.attempt"] == 1
    assert ran[sync_job].name == "later.job tests.jobapp.jobs.TraceProbe"
    # Inside the handler, sync or async, the job's span is the current one.
    for probe in read_records(record, "trace"):
        span = ran[probe.job_id].context
        assert probe.tag == f"{span.trace_id:032x}/{span.span_id:016x}"
    assert {probe.job_id for probe in read_records(record, "trace")} == {sync_job, async_job}
    failed = ran[untraced]
    assert failed.parent is None and failed.context.trace_id != parent.trace_id
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["later.job.outcome"] == "failed"
    assert [event.name for event in failed.events] == ["exception"]


def test_tracing_is_off_by_default_and_records_nothing(later_db, record, spans):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request"):
        job_id = later.enqueue(TraceProbe(n=1))
    assert later_db.job_field(job_id, "trace_context") is None

    async def body(server: Any) -> None:
        await await_stage(job_id, "success")

    serve(body, workers=1)
    assert job_spans(spans) == {}
    # The handler ran outside any span of later's.
    [probe] = read_records(record, "trace")
    assert probe.tag == f"{0:032x}/{0:016x}"
