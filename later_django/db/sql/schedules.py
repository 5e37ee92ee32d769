"""SQL of ``later_schedule`` (recurring jobs) and of the occurrences it enqueues."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Register a schedule, or update it in place. The same cron and zone keep
# the schedule's place (its next fire time and last occurrence): only the
# payload and its options change. A new schedule, or another cron or zone,
# takes the caller's first occurrence; RETURNING last_job_id tells which
# happened. The conflicting row is locked until commit, so two callers
# registering one identifier at once take turns, and the second sees the
# first's schedule.
SAVE: Final = Statement("""
INSERT INTO later_schedule (namespace, identifier, cron, zone, type_name, payload, priority,
    retry_policy, next_run_ms, last_job_id, last_run_ms, sequential, version, created_ms,
    changed_ms)
VALUES (%(namespace)s, %(identifier)s, %(cron)s, %(zone)s, %(type_name)s, %(payload)s,
    %(priority)s, %(retry_policy)s, %(next_run_ms)s, %(first_job_id)s, %(first_run_ms)s,
    %(sequential)s, 1, {now}, {now})
ON CONFLICT (namespace, identifier) DO UPDATE SET
    type_name = excluded.type_name, payload = excluded.payload,
    sequential = excluded.sequential,
    priority = excluded.priority, retry_policy = excluded.retry_policy,
    next_run_ms = CASE
        WHEN later_schedule.cron = excluded.cron AND later_schedule.zone = excluded.zone
        THEN later_schedule.next_run_ms ELSE excluded.next_run_ms END,
    last_job_id = CASE
        WHEN later_schedule.cron = excluded.cron AND later_schedule.zone = excluded.zone
        THEN later_schedule.last_job_id ELSE excluded.last_job_id END,
    last_run_ms = CASE
        WHEN later_schedule.cron = excluded.cron AND later_schedule.zone = excluded.zone
        THEN later_schedule.last_run_ms ELSE excluded.last_run_ms END,
    cron = excluded.cron, zone = excluded.zone,
    version = later_schedule.version + 1, changed_ms = {now}
RETURNING last_job_id
""")

# Remove a schedule (its occurrences enqueued ahead are cancelled apart).
REMOVE: Final = Statement("""
DELETE FROM later_schedule WHERE namespace = %(namespace)s AND identifier = %(identifier)s
""")

# Every schedule of a namespace, by identifier.
LIST: Final = Statement("""
SELECT identifier, cron, zone, type_name, priority, next_run_ms, last_job_id, last_run_ms
FROM later_schedule WHERE namespace = %(namespace)s ORDER BY identifier
""")

# Schedules owing an occurrence within ahead_ms, read without a lock: the
# advance below is the compare-and-swap that decides who enqueues it.
# Sequential ones only where the reader can enqueue them (with_sequential):
# on a server without their setting they would wait at the front of every
# read and hold back the schedules behind them.
DUE: Final = Statement("""
SELECT identifier, cron, zone, type_name, payload, priority, retry_policy, next_run_ms,
    version, {now}, sequential
FROM later_schedule
WHERE namespace = %(namespace)s AND next_run_ms <= {now} + %(ahead_ms)s
  AND (%(with_sequential)s OR NOT sequential)
ORDER BY next_run_ms LIMIT %(limit)s
""")

# The sequential schedules owing an occurrence: what a server that cannot
# enqueue them says waits.
SEQUENTIAL_DUE: Final = Statement("""
SELECT identifier FROM later_schedule
WHERE namespace = %(namespace)s AND next_run_ms <= {now} + %(ahead_ms)s AND sequential
ORDER BY next_run_ms LIMIT %(limit)s
""")

# Move a schedule past the occurrences just enqueued, only if nobody wrote
# it since it was read (its version); on PostgreSQL a row another server is
# advancing is skipped, not waited for.
ADVANCE: Final = Statement("""
UPDATE later_schedule SET next_run_ms = %(next_run_ms)s, last_job_id = %(last_job_id)s,
    last_run_ms = %(last_run_ms)s, version = version + 1, changed_ms = {now}
WHERE id IN (
    SELECT id FROM later_schedule
    WHERE namespace = %(namespace)s AND identifier = %(identifier)s AND version = %(version)s
    {skip_locked})
""")

# One occurrence, due at its exact fire time even when that is already past
# (a plain insert would move it to now): ready when due, else delayed; its
# stage. Its queue's column value ('' for the default queue), and its
# concurrency key and limit when its type has one. A sequential schedule's
# goes in its partition of the reserved topic, at the sequence its
# partition's counter gave it (topic, partition and sequence are NULL for
# the others).
INSERT_OCCURRENCE: Final = Statement("""
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history, recurring, queue,
    concurrency_key, concurrency_limit, topic, partition, sequence)
SELECT %(job_id)s, %(namespace)s, %(type_name)s, %(payload)s, t.stage, %(priority)s, 0,
    %(retry_policy)s, NULL, t.now, t.due, t.now, t.stage || '@' || t.now || ';',
    %(recurring)s, %(queue)s, %(concurrency_key)s, %(concurrency_limit)s, %(topic)s,
    %(partition)s, %(sequence)s
FROM (
    SELECT r.now, r.due, CASE WHEN r.due > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (SELECT {now} AS now, CAST(%(run_at_ms)s AS BIGINT) AS due) r
) t
RETURNING stage
""")

# Occurrences enqueued ahead, not due yet: cancelled when their schedule
# changes its cron or is removed (a stage change as every cancel's). One
# already due but not promoted yet is left to run, like one already ready.
CANCEL_OCCURRENCES: Final = Statement("""
UPDATE later_job SET stage = 'cancelled', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    history = history || 'cancelled@' || {greatest}({now}, changed_ms) || ';'
WHERE namespace = %(namespace)s AND stage = 'delayed' AND recurring = %(recurring)s
  AND run_at_ms > {now}
RETURNING id
""")
