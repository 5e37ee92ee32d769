"""SQL of the dashboard: its figures (``later_dashboard_stat``,
``later_queue_sample``) and its lists of jobs (its actions on jobs are
jobs.py's).

Every list reads one index in that index's order, and repeats the index's
predicate as the index states it (SQLite uses a partial index only for a
query whose terms imply it), so a page costs the page at any backlog. The
plans are in docs/how-to/dashboard.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from later_django.db.sql import Statement, compose
from later_django.db.sql.partitions import UNFINISHED


@dataclass(frozen=True, slots=True)
class ListOrder:
    """An index a list reads: its predicate ("" for an index of every job)
    and its key, in list order ((column, descending), ...). The last column
    is unique within it."""

    where: str
    keys: tuple[tuple[str, bool], ...]


# Every job, newest first: ids are ULIDs, so id order is creation order, and
# the primary key serves the list. No index of its own: plain jobs pay
# nothing for it.
RECENT: Final = ListOrder("", (("id", True),))
# Plain jobs of one queue ready to run, in the order workers take them (the
# list pins the queue: the index's key starts with it).
READY: Final = ListOrder(
    "stage = 'enqueued' AND topic IS NULL", (("priority", True), ("id", False))
)
# A topic's unfinished jobs, by partition and sequence.
PARTITION: Final = ListOrder(
    compose("topic IS NOT NULL AND {unfinished}", unfinished=UNFINISHED),
    (("partition", False), ("sequence", False)),
)
# Delayed and requeued jobs, soonest due first.
DUE: Final = ListOrder("stage IN ('delayed', 'requeued')", (("run_at_ms", False), ("id", False)))
# Running jobs, by when their lease runs out.
RUNNING: Final = ListOrder("stage = 'running'", (("lease_expires_ms", False), ("id", False)))
# Finished jobs, latest first (their expiry is their finish plus the retention).
FINISHED: Final = ListOrder("expires_ms IS NOT NULL", (("expires_ms", True), ("id", True)))
# Waiting, failed and cancelled jobs, latest change first.
ATTENTION: Final = ListOrder(
    "stage IN ('waiting', 'failed', 'cancelled')", (("changed_ms", True), ("id", True))
)
# An id search: ids sort by creation time. The bounds are the prefix and
# the prefix padded with the last character of the id alphabet, which hold
# under any collation of the column.
BY_ID: Final = ListOrder("id >= %s AND id <= %s", (("id", False),))

# A job's attempts as its handler counts them: claims given back do not
# count. The columns of a JobSummary, in its order, as the job list
# (db/reads.py) writes them into the query it assembles; JOB_CHILDREN and
# JOB_PARENTS name the same columns, in the same order.
SUMMARY_COLUMNS: Final = (
    "id, type_name, stage, priority, attempts - COALESCE(uncounted, 0), created_ms, "
    "run_at_ms, changed_ms, topic, partition, sequence, last_error IS NOT NULL AS failed_before, "
    "queue"
)

# A job without its payload (JobDetail's columns, in its order).
JOB_DETAIL: Final = Statement("""
SELECT id, type_name, stage, priority, attempts - COALESCE(uncounted, 0), created_ms,
    run_at_ms, changed_ms, started_ms, finished_ms, expires_ms, lease_owner, lease_expires_ms,
    last_error, history, parent_id, recurring, topic, partition, sequence, queue, unique_key,
    unique_slot_ms, concurrency_key, concurrency_limit
FROM later_job WHERE id = %(job_id)s AND namespace = %(namespace)s
""")

# Up to a page of a job's continuations (the parent index), fan-in
# children waiting on another parent included (later_fan_in's parent
# index); SUMMARY_COLUMNS.
JOB_CHILDREN: Final = Statement("""
SELECT id, type_name, stage, priority, attempts - COALESCE(uncounted, 0), created_ms,
    run_at_ms, changed_ms, topic, partition, sequence, last_error IS NOT NULL AS failed_before,
    queue
FROM later_job
WHERE id IN (
    SELECT id FROM later_job WHERE parent_id = %(job_id)s AND parent_id IS NOT NULL
    UNION
    SELECT child_id FROM later_fan_in WHERE parent_id = %(job_id)s)
ORDER BY id LIMIT %(limit)s
""")

# Every parent of a fan-in job, in id order, with the job while it is kept
# (its SUMMARY_COLUMNS are named alone: later_fan_in has none of them).
JOB_PARENTS: Final = Statement("""
SELECT f.parent_id, id, type_name, stage, priority, attempts - COALESCE(uncounted, 0),
    created_ms, run_at_ms, changed_ms, topic, partition, sequence,
    last_error IS NOT NULL AS failed_before, queue
FROM later_fan_in f LEFT JOIN later_job j ON j.id = f.parent_id
WHERE f.child_id = %(job_id)s ORDER BY f.parent_id
""")

# Jobs running now, the longest running first, with the server whose lease
# they hold.
RUNNING_JOBS: Final = Statement("""
SELECT id, type_name, lease_owner, started_ms, topic, partition FROM later_job
WHERE namespace = %(namespace)s AND stage = 'running' ORDER BY started_ms LIMIT %(limit)s
""")

# Servers with a heartbeat in the last within_ms.
SERVERS: Final = Statement("""
SELECT id, hostname, pid, workers, topics, started_ms, heartbeat_ms, queues, version
FROM later_server
WHERE namespace = %(namespace)s AND heartbeat_ms >= {now} - %(within_ms)s
ORDER BY hostname, pid
""")

# One server's figures of its last stretch (the recorder writes them).
STAT_INSERT: Final = Statement("""
INSERT INTO later_dashboard_stat (namespace, server_id, at_ms, started, succeeded, retried,
    failed, regular_waits, regular_sum_ms, regular_max_ms, partition_waits, partition_sum_ms,
    partition_max_ms)
VALUES (%(namespace)s, %(server_id)s, {now}, %(started)s, %(succeeded)s, %(retried)s,
    %(failed)s, %(regular_waits)s, %(regular_sum_ms)s, %(regular_max_ms)s,
    %(partition_waits)s, %(partition_sum_ms)s, %(partition_max_ms)s)
""")

# The figures written in the last window_ms.
STATS_SINCE: Final = Statement("""
SELECT at_ms, started, succeeded, retried, failed, regular_waits, regular_sum_ms,
    regular_max_ms, partition_waits, partition_sum_ms, partition_max_ms
FROM later_dashboard_stat WHERE namespace = %(namespace)s AND at_ms >= {now} - %(window_ms)s
""")

# Figures older than kept_ms.
STATS_PRUNE: Final = Statement("""
DELETE FROM later_dashboard_stat WHERE namespace = %(namespace)s AND at_ms < {now} - %(kept_ms)s
""")

# The backlog now, from the counters: one row, whatever the backlog.
SAMPLE_TAKE: Final = Statement("""
INSERT INTO later_queue_sample (namespace, at_ms, ready, scheduled, running, waiting, partitioned)
SELECT %(namespace)s, {now},
    COALESCE(SUM(CASE WHEN lane <> 'partition' AND stage = 'enqueued' THEN n END), 0),
    COALESCE(SUM(CASE WHEN lane <> 'partition' AND stage IN ('delayed', 'requeued') THEN n END), 0),
    COALESCE(SUM(CASE WHEN lane <> 'partition' AND stage = 'running' THEN n END), 0),
    COALESCE(SUM(CASE WHEN lane <> 'partition' AND stage = 'waiting' THEN n END), 0),
    COALESCE(SUM(CASE WHEN lane = 'partition' AND stage NOT IN ('success', 'failed', 'cancelled')
        THEN n END), 0)
FROM later_stage_count WHERE namespace = %(namespace)s
ON CONFLICT (namespace, at_ms) DO NOTHING
""")

# The samples of a window, one point per stretch of step_ms: each the
# largest of its stretch, so a peak between two points is never lost.
SAMPLES_SINCE: Final = Statement("""
SELECT MAX(at_ms), MAX(ready), MAX(scheduled), MAX(running), MAX(waiting), MAX(partitioned)
FROM later_queue_sample WHERE namespace = %(namespace)s AND at_ms >= {now} - %(window_ms)s
GROUP BY at_ms / %(step_ms)s ORDER BY 1
""")

# Samples older than kept_ms.
SAMPLES_PRUNE: Final = Statement("""
DELETE FROM later_queue_sample WHERE namespace = %(namespace)s AND at_ms < {now} - %(kept_ms)s
""")

# Counts per stage and lane, for the overview's split of the two lanes.
LANE_COUNTS: Final = Statement("""
SELECT lane, stage, SUM(n) FROM later_stage_count WHERE namespace = %(namespace)s
GROUP BY lane, stage
""")

# Every queue's row of later_queue (written by its first pause): a handful.
QUEUE_STATES: Final = Statement("""
SELECT name, paused, changed_ms, rate_window_end_ms, rate_started FROM later_queue
WHERE namespace = %(namespace)s ORDER BY name
""")

# Every consumer group's place in every partition of the retained log.
LOG_CONSUMERS: Final = Statement("""
SELECT c.topic, c.consumer_group, c.part, c.committed_offset, COALESCE(p.next_offset, 0),
    c.member, c.epoch, c.expires_ms
FROM later_log_consumer c
LEFT JOIN later_log_partition p
    ON p.namespace = c.namespace AND p.topic = c.topic AND p.part = c.part
WHERE c.namespace = %(namespace)s
ORDER BY c.topic, c.consumer_group, c.part
""")
