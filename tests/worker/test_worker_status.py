"""The worker's status line: outcomes since the last line, the ready backlog, the rate."""

from __future__ import annotations

import logging
import re

import pytest

import later_django as later
from later_django.worker import status
from later_django.worker.server import Server
from tests.helpers import await_record, await_stage, await_until, in_thread, serve, set_later
from tests.jobapp.jobs import Flaky, Noop, NoRetry, Sleep

LINE = re.compile(
    r"^last \d+s: \d+ succeeded, \d+ failed, \d+ retried \(\d+\.\d jobs/s\); "
    r"\d+ stuck jobs recovered; (\d+|unknown) ready; \d+ workers$"
)


def status_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "worker_status"]


def totals(caplog: pytest.LogCaptureFixture) -> tuple[int, int, int]:
    lines = status_lines(caplog)
    return (
        sum(r.succeeded for r in lines),  # type: ignore[attr-defined]
        sum(r.failed for r in lines),  # type: ignore[attr-defined]
        sum(r.retried for r in lines),  # type: ignore[attr-defined]
    )


def test_worker_status_line_counts_outcomes_backlog_and_rate(later_db, record, monkeypatch, caplog):
    """One INFO line per interval: what was stored since the last line, the
    ready backlog from the counters, and the rate; lines go on while idle."""
    monkeypatch.setattr(status, "STATUS_INTERVAL", 0.2)
    caplog.set_level(logging.INFO, logger="later_django.worker.status")

    async def body(server: Server) -> None:
        # The only worker sleeps in a handler while six jobs wait behind it.
        sleep_id = await in_thread(later.enqueue, Sleep(seconds=1.5))
        await await_record(record, "sleep-start", sleep_id)
        waiting = [
            *[await in_thread(later.enqueue, Noop(n=n)) for n in range(3)],
            *[await in_thread(later.enqueue, NoRetry()) for _ in range(2)],
            await in_thread(later.enqueue, Flaky(succeed_on=2)),
        ]

        async def saw_backlog() -> bool:
            return any(r.ready == 6 for r in status_lines(caplog))  # type: ignore[attr-defined]

        await await_until(saw_backlog, 10, lambda: f"a line with 6 ready: {caplog.text}")
        for job_id in [sleep_id, *waiting[:3], waiting[5]]:
            await await_stage(job_id, "success")
        for job_id in waiting[3:5]:
            await await_stage(job_id, "failed")

        async def counted() -> bool:
            lines = status_lines(caplog)
            # Sleep, three Noops and the Flaky one; two NoRetry; Flaky's first attempt.
            return totals(caplog) == (5, 2, 1) and lines[-1].ready == 0  # type: ignore[attr-defined]

        await await_until(counted, 10, lambda: f"totals {totals(caplog)}: {caplog.text}")

        count = len(status_lines(caplog))

        async def idle_line() -> bool:
            return len(status_lines(caplog)) > count

        await await_until(idle_line, 10, "a line while idle")

    serve(body, workers=1)
    lines = status_lines(caplog)
    assert all(r.levelno == logging.INFO for r in lines)
    assert all(LINE.match(r.getMessage()) for r in lines), [r.getMessage() for r in lines]
    for r in lines:
        finished = r.succeeded + r.failed + r.retried  # type: ignore[attr-defined]
        assert r.per_second == pytest.approx(finished / r.seconds)  # type: ignore[attr-defined]
        assert r.workers == 1  # type: ignore[attr-defined]
    outcomes = [(r.succeeded, r.failed, r.retried) for r in lines]  # type: ignore[attr-defined]
    assert (0, 0, 0) in outcomes, "an idle interval still logs its line"
    assert totals(caplog) == (5, 2, 1)


def test_worker_status_line_counts_stuck_jobs_this_server_recovered(
    later_db, monkeypatch, caplog, settings
):
    """A job whose process died (its lease expired) and that this server's
    maintenance recovered is counted in the next line."""
    monkeypatch.setattr(status, "STATUS_INTERVAL", 0.2)
    set_later(settings, STUCK_JOB_GRACE=0.1, MAINTENANCE_INTERVAL=0.1)
    caplog.set_level(logging.INFO, logger="later_django.worker.status")
    job_id = later.enqueue(Noop())
    # Claimed by a process that died: running, its lease long expired.
    later_db.execute(
        "UPDATE later_job SET stage = 'running', attempts = 1, lease_owner = 'gone', "
        "lease_expires_ms = 1, started_ms = changed_ms WHERE id = %s",
        [job_id],
    )

    async def body(server: Server) -> None:
        await await_stage(job_id, "success")

        async def counted() -> bool:
            return sum(r.recovered for r in status_lines(caplog)) == 1  # type: ignore[attr-defined]

        await await_until(counted, 10, lambda: caplog.text)

    serve(body, workers=1)
    assert any("1 stuck jobs recovered" in r.getMessage() for r in status_lines(caplog))
