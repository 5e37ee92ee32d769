"""SQL that reads ``later_stage_count``. The triggers that write it differ per
vendor (postgresql.py, sqlite.py)."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import QUEUE_RUNS

# A stage's count is SUM(n) on both databases: PostgreSQL appends delta
# rows, SQLite keeps one row per stage.
STAGE_COUNTS_SQL: Final = """
SELECT stage, SUM(n) FROM later_stage_count WHERE namespace = %s GROUP BY stage
"""

# The jobs of one queue ready now, none while it is paused: the backlog
# autoscale reads (partition jobs, in their own lane, wait for their turn
# and are no work for a plain worker). %s: the queue's lane (queue_names.py).
QUEUE_READY_SQL: Final = compose(
    """
SELECT COALESCE(SUM(n), 0) FROM later_stage_count
WHERE namespace = %s AND stage = 'enqueued' AND lane = %s AND {queue_runs}
""",
    queue_runs=QUEUE_RUNS,
)
