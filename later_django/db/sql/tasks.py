"""SQL of ``later_task_result``: what the Django Tasks backend keeps per task job."""

from __future__ import annotations

from typing import Final

# An attempt's end, in one statement: the worker ids (those before it, then
# the server holding the job's lease), the errors so far and the return
# value. Fenced by the attempt: an abandoned attempt that ends after its
# job was claimed again writes nothing.
TASK_RESULT_SAVE_SQL: Final = """
INSERT INTO later_task_result (job_id, worker_ids, errors, return_value)
SELECT id, CAST(%s AS TEXT) || '"' || COALESCE(lease_owner, 'unknown') || '"]', %s, %s
FROM later_job WHERE id = %s AND attempts = %s
ON CONFLICT (job_id) DO UPDATE SET
    worker_ids = excluded.worker_ids,
    errors = excluded.errors,
    return_value = excluded.return_value
"""
