"""SQL of ``later_schedule`` (recurring jobs) and of the occurrences it enqueues."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import TO_CANCELLED, job_insert
from later_django.db.sql.partitions import LANE_COLUMNS

SCHEDULE_COLUMNS: Final = (
    "namespace, identifier, cron, zone, type_name, payload, priority, retry_policy, "
    "next_run_ms, last_job_id, last_run_ms, sequential, version, created_ms, changed_ms"
)

# Registers a schedule, or updates it in place. The same cron and zone keep
# the schedule's place (its next fire time and last occurrence): only the
# payload and its options change. A new schedule, or another cron or zone,
# takes the caller's first occurrence; RETURNING last_job_id tells which
# happened. The conflicting row is locked until commit, so two callers
# registering one identifier at once take turns, and the second sees the
# first's schedule.
SCHEDULE_SAVE_SQL: Final = compose(
    """
INSERT INTO later_schedule ({columns})
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 1, {now}, {now})
ON CONFLICT (namespace, identifier) DO UPDATE SET
    type_name = excluded.type_name, payload = excluded.payload,
    sequential = excluded.sequential,
    priority = excluded.priority, retry_policy = excluded.retry_policy,
    next_run_ms = CASE WHEN {same} THEN later_schedule.next_run_ms
        ELSE excluded.next_run_ms END,
    last_job_id = CASE WHEN {same} THEN later_schedule.last_job_id
        ELSE excluded.last_job_id END,
    last_run_ms = CASE WHEN {same} THEN later_schedule.last_run_ms
        ELSE excluded.last_run_ms END,
    cron = excluded.cron, zone = excluded.zone,
    version = later_schedule.version + 1, changed_ms = {now}
RETURNING last_job_id
""",
    columns=SCHEDULE_COLUMNS,
    same="later_schedule.cron = excluded.cron AND later_schedule.zone = excluded.zone",
)

SCHEDULE_REMOVE_SQL: Final = """
DELETE FROM later_schedule WHERE namespace = %s AND identifier = %s
"""

SCHEDULE_LIST_SQL: Final = """
SELECT identifier, cron, zone, type_name, priority, next_run_ms, last_job_id, last_run_ms
FROM later_schedule WHERE namespace = %s ORDER BY identifier
"""

# Schedules owing an occurrence within ``ahead`` ms, read without a lock: the
# advance below is the compare-and-swap that decides who enqueues it.
# Sequential ones only where the reader can enqueue them (the first %s):
# on a server without their setting they would wait at the front of every
# read and hold back the schedules behind them.
SCHEDULE_DUE_SQL: Final = """
SELECT identifier, cron, zone, type_name, payload, priority, retry_policy, next_run_ms,
    version, {now}, sequential
FROM later_schedule
WHERE namespace = %s AND next_run_ms <= {now} + %s AND (%s OR NOT sequential)
ORDER BY next_run_ms LIMIT %s
"""

# The sequential schedules owing an occurrence: what a server that cannot
# enqueue them says waits.
SCHEDULE_SEQUENTIAL_DUE_SQL: Final = """
SELECT identifier FROM later_schedule
WHERE namespace = %s AND next_run_ms <= {now} + %s AND sequential
ORDER BY next_run_ms LIMIT %s
"""

# Moves a schedule past the occurrences just enqueued, only if nobody wrote
# it since it was read (its version); on PostgreSQL a row another server is
# advancing is skipped, not waited for.
SCHEDULE_ADVANCE_SQL: Final = """
UPDATE later_schedule SET next_run_ms = %s, last_job_id = %s, last_run_ms = %s,
    version = version + 1, changed_ms = {now}
WHERE id IN (
    SELECT id FROM later_schedule
    WHERE namespace = %s AND identifier = %s AND version = %s {skip_locked})
"""

# One occurrence, due at its exact fire time even when that is already past
# (the plain insert would move it to now): ready when due, else delayed.
JOB_INSERT_OCCURRENCE_SQL: Final = job_insert(extra_columns=", recurring", exact_time=True)
# One of a schedule whose type's @job names a queue.
JOB_INSERT_QUEUED_OCCURRENCE_SQL: Final = job_insert(
    extra_columns=", recurring, queue", exact_time=True
)
# One of a schedule whose type has a concurrency limit: its queue's column
# value ('' for the default queue), key and limit.
JOB_INSERT_KEYED_OCCURRENCE_SQL: Final = job_insert(
    extra_columns=", recurring, queue, concurrency_key, concurrency_limit", exact_time=True
)
# An occurrence of a sequential schedule: in its partition of the reserved
# topic, at the sequence its partition's counter gave it.
JOB_INSERT_SEQUENTIAL_OCCURRENCE_SQL: Final = job_insert(
    extra_columns=", recurring" + LANE_COLUMNS, exact_time=True
)

# Occurrences enqueued ahead, not due yet: cancelled when their schedule
# changes its cron or is removed. One already due but not promoted yet is
# left to run, like one already ready.
JOB_CANCEL_OCCURRENCES_SQL: Final = compose(
    """
UPDATE later_job SET {to_cancelled}
WHERE namespace = %s AND stage = 'delayed' AND recurring = %s AND run_at_ms > {now}
RETURNING id
""",
    to_cancelled=TO_CANCELLED,
)
