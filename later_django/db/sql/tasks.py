"""SQL of ``later_task_result``: what the Django Tasks backend keeps per task job."""

from __future__ import annotations

from typing import Final

# An attempt's end: its worker ids, its errors so far and its return value.
# Unfenced: it runs only in the transaction that stored the attempt's
# outcome under its claim's fence, and only if that fence held.
TASK_RESULT_WRITE_SQL: Final = """
INSERT INTO later_task_result (job_id, worker_ids, errors, return_value)
VALUES (%s, %s, %s, %s)
ON CONFLICT (job_id) DO UPDATE SET
    worker_ids = excluded.worker_ids,
    errors = excluded.errors,
    return_value = excluded.return_value
"""
