"""An operator's or a caller's actions on a job (``dialect.control``): cancel
it, retry a failed one, run a delayed one now.
"""

from __future__ import annotations

import pytest

from later_django.db.rows import FailureWrite
from later_django.ids import new_job_id
from later_django.states import PARENT_FAILED
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    NS,
    assert_counts,
    claim_one,
    complete,
    cursor_of,
    db_now,
    insert,
    insert_child,
    job_row,
    owned,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def test_cancel_cancels_only_jobs_not_started(later_db, dialect):
    """Ready, delayed and waiting jobs are cancelled, with their waiting
    descendants failed; running (only asked to stop), finished and other
    namespaces' are not."""
    ready, delayed, running = insert(later_db), insert(later_db, delay_ms=HOUR_MS), insert(later_db)
    elsewhere = insert(later_db, namespace="other")
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_job SET priority = 100 WHERE id = %s", [running])
    claim_one(later_db, running)
    child = insert_child(later_db, ready)[0]
    grandchild = insert_child(later_db, child)[0]

    def cancel(job_id: str, namespace: str = NS) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.control.cancel(
                c, namespace=namespace, job_id=job_id, retention_ms=HOUR_MS
            )

    before = db_now(later_db)
    assert [cancel(ready), cancel(delayed)] == [True, True]
    after = db_now(later_db)
    assert [cancel(ready), cancel(elsewhere), cancel(new_job_id())] == [False] * 3
    assert cancel(running) is True, "a running job is asked to stop, not cancelled"
    assert stages(later_db, ready, delayed, running, elsewhere, child, grandchild) == [
        "cancelled",
        "cancelled",
        "running",
        "enqueued",
        "failed",
        "failed",
    ]
    row = job_row(later_db, ready)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert cancel(child) is False, "a failed job is finished"
    waiting = insert_child(later_db, running)[0]
    assert cancel(waiting) is True
    assert_counts(later_db)


def test_cancel_cancels_a_waiting_job_asks_a_running_one_and_refuses_the_rest(later_db, dialect):
    """control.cancel: a job not started is cancelled, a running one is asked
    to stop; False only for a finished or unknown one (or another
    namespace's)."""
    done = insert(later_db)
    complete(later_db, [(done, claim_one(later_db, done).attempts)])
    running = insert(later_db)
    claim_one(later_db, running)
    ready = insert(later_db)
    with cursor_of(later_db, atomic=True) as c:
        for job_id in (ready, running):
            assert dialect.control.cancel(c, namespace=NS, job_id=job_id, retention_ms=DAY_MS)
        for job_id in (done, new_job_id()):
            assert not dialect.control.cancel(c, namespace=NS, job_id=job_id, retention_ms=DAY_MS)
        assert not dialect.control.cancel(c, namespace="other", job_id=running, retention_ms=DAY_MS)
    assert stages(later_db, ready, running, done) == ["cancelled", "running", "success"]
    asked = "SELECT cancel_requested_ms FROM later_job WHERE id = %s"
    assert later_db.scalar(asked, [running]) is not None
    assert_counts(later_db)


def test_retry_failed_and_run_now_change_only_the_stage_they_apply_to(later_db, dialect):
    failed = insert(later_db)
    job = claim_one(later_db, failed)
    child, _ = insert_child(later_db, failed)
    delayed = insert(later_db, delay_ms=HOUR_MS)
    with cursor_of(later_db, atomic=True) as c:
        dialect.hot.fail(c, owned(job), FailureWrite(error="boom", retention_ms=DAY_MS))
    assert stages(later_db, failed, child) == ["failed", "failed"]
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.control.retry_failed(c, namespace=NS, job_id=child) is None  # parent failed
        assert dialect.control.retry_failed(c, namespace=NS, job_id=failed) == 1
        assert dialect.control.retry_failed(c, namespace=NS, job_id=failed) is None
        assert dialect.control.run_now(c, namespace=NS, job_id=delayed) is True
        assert dialect.control.run_now(c, namespace=NS, job_id=failed) is False
    assert stages(later_db, failed, child, delayed) == ["enqueued", "waiting", "enqueued"]
    assert job_row(later_db, failed)["expires_ms"] is None
    assert_counts(later_db)
