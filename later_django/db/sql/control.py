"""SQL of an operator's or a caller's actions on one job (``dialect.control``):
cancel it, retry a failed one, run a delayed one now."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Cancel a job that has not started (a stage change as every cancel's).
CANCEL: Final = Statement("""
UPDATE later_job SET stage = 'cancelled', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    history = history || 'cancelled@' || {greatest}({now}, changed_ms) || ';'
WHERE id = %(job_id)s AND namespace = %(namespace)s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'requeued')
""")

# Ask a running job to stop: a request its worker finds within a second
# (hot.py's CANCEL_REQUESTED) and honours by stopping the handler. The
# first request's time is kept.
REQUEST_CANCEL: Final = Statement("""
UPDATE later_job SET cancel_requested_ms = COALESCE(cancel_requested_ms, {now})
WHERE id = %(job_id)s AND namespace = %(namespace)s AND stage = 'running'
""")

# Whether a job is unfinished: cancel() looks again at one that moved
# between CANCEL and REQUEST_CANCEL.
UNFINISHED: Final = Statement("""
SELECT 1 FROM later_job
WHERE id = %(job_id)s AND namespace = %(namespace)s
  AND stage NOT IN ('success', 'failed', 'cancelled')
""")

# A failed plain job runs again: ready now, its attempts go on counting (so
# its retry policy, already spent, gives it this one run). A cancel request
# left on the row (by a release whose failures did not honour it) is an old
# attempt's: cleared. Not a continuation failed because its parent did
# ('parent failed', 'parent missing': states.PARENT_FAILED and
# PARENT_MISSING): retrying the parent revives it. Not a unique job whose
# key another unfinished job of its type holds now: the key is that job's
# (the rule of the walks that revive continuations, so both keep
# later_job_unique alike).
RETRY_FAILED: Final = Statement("""
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';',
    run_at_ms = {now}, finished_ms = NULL, expires_ms = NULL, cancel_requested_ms = NULL
WHERE id = %(job_id)s AND namespace = %(namespace)s AND stage = 'failed' AND topic IS NULL
  AND NOT (parent_id IS NOT NULL AND last_error IN ('parent failed', 'parent missing'))
  AND NOT (later_job.unique_key IS NOT NULL AND EXISTS (
    SELECT 1 FROM later_job o
    WHERE o.namespace = later_job.namespace AND o.type_name = later_job.type_name
      AND o.unique_key = later_job.unique_key
      AND o.stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')))
""")

# A delayed or requeued job due now.
RUN_NOW: Final = Statement("""
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';', run_at_ms = {now}
WHERE id = %(job_id)s AND namespace = %(namespace)s AND stage IN ('delayed', 'requeued')
""")
