"""SQL only SQLite runs: its clock, the claim and batch completion of one
writer at a time, multi-row inserts, the row-level counter triggers and its
PRAGMAs. Shared statements are in the domain modules."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import (
    CLAIM_RETURNING,
    IN_QUEUE,
    INSERT_COLUMNS,
    LEASE_DROPPED,
    QUEUE_RUNS,
    RELEASE,
    TO_RUNNING,
    TO_SUCCESS,
)
from later_django.db.sql.limits import KEYED_PICK

# -- clock fragment (see __init__.py) -------------------------------------------
# julianday('now') has millisecond precision and one value per statement
# step; the 3.40 library here lacks unixepoch('subsec').
NOW_SQL: Final = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"

# -- jobs -----------------------------------------------------------------------
# Ready jobs in bulk: a row carries NewJob's first six fields (id, namespace,
# type_name, payload, priority, retry_policy); the rest is the clock.
JOB_INSERT_MANY_ROW: Final = (
    "(%s, %s, %s, %s, 'enqueued', %s, 0, %s, NULL, {now}, {now}, {now}, "
    "'enqueued@' || {now} || ';')"
)
JOB_INSERT_MANY_SQL: Final = compose(
    "INSERT INTO later_job ({columns}) VALUES {values}", columns=INSERT_COLUMNS
)
# One job due now that sets no option (insert_one's common case): its stage
# is known, so it is the bulk insert of one row, with nothing to compute and
# nothing to return. jobs.JOB_INSERT_SQL's sub-selects and RETURNING would
# cost SQLite about a fifth more.
JOB_INSERT_READY_SQL: Final = compose(JOB_INSERT_MANY_SQL, values=JOB_INSERT_MANY_ROW)
# The same, of a batch in which some job names a queue: each row then ends
# with its queue (NULL for the default one).
JOB_INSERT_MANY_QUEUED_ROW: Final = JOB_INSERT_MANY_ROW[:-1] + ", %s)"
JOB_INSERT_MANY_QUEUED_SQL: Final = compose(
    "INSERT INTO later_job ({columns}, queue) VALUES {values}", columns=INSERT_COLUMNS
)

# A write statement takes SQLite's write lock before it reads, so the
# sub-select and the update see the same rows; no other claim interleaves.
# The claim of one queue's jobs (IN_QUEUE), nothing while it is paused.
_JOB_CLAIM: Final = compose(
    """
UPDATE later_job SET {to_running}
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND {in_queue} AND stage = 'enqueued' AND topic IS NULL
      AND {queue_runs}
    ORDER BY priority DESC, id
    LIMIT %s)
RETURNING {returning}
""",
    to_running=TO_RUNNING,
    returning=CLAIM_RETURNING,
    queue_runs=QUEUE_RUNS,
)
JOB_CLAIM_SQL: Final = compose(_JOB_CLAIM, in_queue=IN_QUEUE)

# The claim of a queue some of whose types have a concurrency key
# (docs/how-to/concurrency-limits.md): limits.KEYED_PICK's jobs. The write lock,
# taken before the statement reads, serialises it with every other claim,
# so the count of running jobs per key it reads is exact.
JOB_CLAIM_KEYED_SQL: Final = compose(
    compose(
        """
UPDATE later_job SET {to_running}
WHERE id IN ({pick})
RETURNING {returning}
""",
        to_running=TO_RUNNING,
        returning=CLAIM_RETURNING,
        pick=KEYED_PICK,
    ),
    lock_candidates="",
)

# Many successes in one statement: each row is fenced by its own attempt.
# The plain "id IN" finds the rows by primary key; a row-value IN alone
# would make SQLite scan the whole table.
JOB_COMPLETE_MANY_SQL: Final = compose(
    """
UPDATE later_job SET {to_success}, {lease_dropped}
WHERE id IN ({ids}) AND (id, attempts) IN (VALUES {pairs}) AND lease_owner = %s
RETURNING id
""",
    to_success=TO_SUCCESS,
    lease_dropped=LEASE_DROPPED,
)

# Waiting continuations of parents that succeeded, and whether each is a
# fan-in child (sql/fan_in.py), which waits for all its parents. A
# statement of its own, after the parents' completion. Most batches have no
# waiting child: this read is all they pay.
JOB_WAITING_CHILDREN_OF_SQL: Final = """
SELECT id, EXISTS (SELECT 1 FROM later_fan_in f WHERE f.child_id = later_job.id)
FROM later_job WHERE parent_id IN ({ids}) AND stage = 'waiting'
"""
# Continuations of one parent that succeeded: due now.
JOB_RELEASE_SQL: Final = compose(
    "UPDATE later_job SET {release} WHERE id IN ({ids}) AND stage = 'waiting'", release=RELEASE
)
