"""SQL that reads ``later_stage_count``. The triggers that write it differ per
vendor (postgresql.py, sqlite.py)."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Each stage's count: SUM(n) on both databases (PostgreSQL appends delta
# rows, SQLite keeps one row per stage).
STAGE_COUNTS: Final = Statement("""
SELECT stage, SUM(n) FROM later_stage_count WHERE namespace = %(namespace)s GROUP BY stage
""")

# The jobs of one queue ready now, none while it is paused: the backlog
# autoscale reads (partition jobs, in their own lane, wait for their turn
# and are no work for a plain worker). lane: the queue's (queue_names.py).
# A paused queue's row is looked at once (an uncorrelated subquery).
QUEUE_READY: Final = Statement("""
SELECT COALESCE(SUM(n), 0) FROM later_stage_count
WHERE namespace = %(namespace)s AND stage = 'enqueued' AND lane = %(lane)s
  AND NOT EXISTS (
    SELECT 1 FROM later_queue q
    WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
""")
