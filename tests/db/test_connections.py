"""How many PostgreSQL connections one later_worker process opens
(docs/how-to/operations.md), and that its start-up checks keep none."""

from __future__ import annotations

import pytest

import later_django as later
from later_django.db import dialect_for
from later_django.db.sql.topics import TOPIC_PARTITIONS
from tests.helpers import wait_until
from tests.jobapp.jobs import Flaky, Noop, NoRetry

# claims + successes + LISTEN + 4 failures + 4 services + 2 maintenance
MAX_PER_PROCESS = 13

OTHER_BACKENDS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
    AND pid <> pg_backend_pid()
"""


def test_a_worker_process_stays_within_its_documented_connections(later_db, workers):
    if not dialect_for(later_db.alias).supports_listen:
        pytest.skip("SQLite has no connection limit to plan for")
    before = int(later_db.scalar(OTHER_BACKENDS))
    # Failures from all 8 workers at once load the failure pool as far as it goes.
    later.enqueue_many([NoRetry() for _ in range(200)])
    later.enqueue_many([Flaky(succeed_on=2) for _ in range(50)])
    later.enqueue_many([Noop(n=n) for n in range(200)])
    worker = workers.start(workers=8)
    seen: list[int] = []

    def drained() -> bool:
        seen.append(int(later_db.scalar(OTHER_BACKENDS)) - before)
        counts = later.stage_counts()
        return counts["failed"] == 200 and counts["success"] == 250

    wait_until(drained, 60, message=lambda: f"the jobs to finish: {workers.logs()}")
    assert worker.proc.poll() is None
    opened = max(seen)
    assert 3 <= opened <= MAX_PER_PROCESS, f"{opened} connections (seen over time: {seen})"


# The last statement the start-up checks run (the stored topics, later.E015),
# as pg_stat_activity shows it.
LAST_CHECK_SQL = TOPIC_PARTITIONS.text.replace("%(namespace)s", "'default'")
IDLE_ON_CHECKS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
    AND pid <> pg_backend_pid() AND state = 'idle' AND query = %s
"""


def test_a_worker_process_closes_its_start_up_checks_connection(later_db, workers):
    """The checks run on the main thread's connection, which serving never
    uses: it is closed before the server starts, not held for the process's life."""
    if not dialect_for(later_db.alias).supports_listen:
        pytest.skip("SQLite has no connection limit to plan for")
    worker = workers.start(workers=1)
    workers.wait_registered(worker)
    job_id = later.enqueue(Noop(n=1))
    workers.wait_stage(job_id, "success", 30)
    # A closed connection's backend exits a moment after the client leaves.
    wait_until(
        lambda: later_db.scalar(IDLE_ON_CHECKS, [LAST_CHECK_SQL]) == 0,
        5,
        "no connection left idle on the start-up checks",
    )
