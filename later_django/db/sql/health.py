"""SQL of ``later_health``: the servers' heartbeats, and its deep checks
(counters against rows, running jobs without a live lease). Reads only.

The deep checks are written to stay cheap on a large ``later_job``: each
part of a count reads one partial index that holds exactly its jobs (the
index's condition is repeated in the part's WHERE, so SQLite's planner can
use it too), and no part reads the successful jobs kept for retention,
which are most of a busy table. Each check is one statement: one snapshot
on either database, in which the counters and the rows agree exactly.
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Every server of the namespace, fresh or not, with the database's clock:
# one row with NULLs when there is none.
SERVER_BEATS: Final = Statement("""
SELECT clock.now_ms, s.id, s.hostname, s.pid, s.version, s.heartbeat_ms
FROM (SELECT {now} AS now_ms) clock
LEFT JOIN later_server s ON s.namespace = %(namespace)s
ORDER BY s.hostname, s.pid
""")

# The (stage, lane) pairs whose counters and rows differ, but 'success'.
# One part per partial index of models/jobs.py: later_job_ready,
# later_job_partition_head, later_job_due, later_job_leased and
# later_job_attention; together they hold every job that is not a success,
# each once (the partition jobs that have not finished are the second
# part's alone). A job's lane is written as the counter triggers write it
# (migration 0014).
COUNTER_DRIFT: Final = Statement("""
SELECT stage, lane, SUM(counted), SUM(found) FROM (
    SELECT stage, lane, n AS counted, 0 AS found FROM later_stage_count
    WHERE namespace = %(namespace)s AND stage <> 'success'
    UNION ALL
    SELECT stage, CASE WHEN queue = '' THEN '' ELSE 'q:' || queue END, 0, COUNT(*)
    FROM later_job
    WHERE namespace = %(namespace)s AND stage = 'enqueued' AND topic IS NULL GROUP BY 1, 2
    UNION ALL
    SELECT stage, 'partition', 0, COUNT(*) FROM later_job
    WHERE namespace = %(namespace)s AND topic IS NOT NULL
        AND NOT stage IN ('success', 'failed', 'cancelled') GROUP BY 1, 2
    UNION ALL
    SELECT stage, CASE WHEN queue = '' THEN '' ELSE 'q:' || queue END, 0, COUNT(*)
    FROM later_job
    WHERE namespace = %(namespace)s AND stage IN ('delayed', 'requeued') AND topic IS NULL
    GROUP BY 1, 2
    UNION ALL
    SELECT stage, CASE WHEN queue = '' THEN '' ELSE 'q:' || queue END, 0, COUNT(*)
    FROM later_job
    WHERE namespace = %(namespace)s AND stage = 'running' AND topic IS NULL GROUP BY 1, 2
    UNION ALL
    SELECT stage,
        CASE WHEN topic IS NOT NULL THEN 'partition' WHEN queue = '' THEN ''
        ELSE 'q:' || queue END, 0, COUNT(*)
    FROM later_job
    WHERE namespace = %(namespace)s AND stage IN ('waiting', 'failed', 'cancelled')
        AND (topic IS NULL OR stage <> 'waiting') GROUP BY 1, 2
) sums
GROUP BY stage, lane HAVING SUM(counted) <> SUM(found)
ORDER BY stage, lane
""")

# How many running jobs have a lease missing or expired more than
# expired_for_ms ago: the rescuer takes a job STUCK_JOB_GRACE after its
# lease expired, so one left long after says that nobody rescues.
# later_job_leased holds them all.
RUNNING_UNLEASED_COUNT: Final = Statement("""
SELECT COUNT(*) FROM later_job
WHERE namespace = %(namespace)s AND stage = 'running'
  AND (lease_owner IS NULL OR lease_expires_ms IS NULL
       OR lease_expires_ms < {now} - %(expired_for_ms)s)
""")

# The first three of those jobs, with how long ago their lease expired.
RUNNING_UNLEASED: Final = Statement("""
SELECT id, lease_owner, {now} - lease_expires_ms FROM later_job
WHERE namespace = %(namespace)s AND stage = 'running'
  AND (lease_owner IS NULL OR lease_expires_ms IS NULL
       OR lease_expires_ms < {now} - %(expired_for_ms)s)
ORDER BY id LIMIT 3
""")
