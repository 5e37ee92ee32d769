"""SQL both databases run on ``later_job``: enqueue, the worker's writes under
its fence, and maintenance. The claim and the batch completion differ per
vendor (postgresql.py, sqlite.py)."""

from __future__ import annotations

import functools
from typing import Final

from later_django.db.sql import compose
from later_django.states import PARENT_FAILED

INSERT_COLUMNS: Final = (
    "id, namespace, type_name, payload, stage, priority, attempts, retry_policy, "
    "parent_id, created_ms, run_at_ms, changed_ms, history"
)


# -- stage changes: the SET of every statement that moves a job, written once ---------
TO_RUNNING: Final = """stage = 'running', attempts = attempts + 1,
    changed_ms = {stamp}, started_ms = {stamp}, lease_owner = %s,
    lease_expires_ms = {now} + %s, history = history || 'running@' || {stamp} || ';'"""

# -- enqueue --------------------------------------------------------------------------
# One job, delayed or ready by the database's clock, on the columns of
# INSERT_COLUMNS and then {extra_columns}: due at {due}, stored as due at
# {run_at} (r.due is the time asked for, r.now the clock).
_INSERT: Final = """
INSERT INTO later_job ({columns}{extra_columns})
SELECT %s, %s, %s, %s, t.stage, %s, 0, %s, NULL, t.now, t.run_at, t.now,
    t.stage || '@' || t.now || ';'{extra_values}
FROM (
    SELECT r.now, {run_at} AS run_at,
        CASE WHEN r.due > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (SELECT n.now, {due} AS due FROM (SELECT {now} AS now) n) r
) t{on_conflict}
RETURNING stage"""

# A job with a unique key is not written while another holds the key (a
# unique index of migration 0015 says so): the insert then returns no row.
# The WHERE lets SQLite read an INSERT ... SELECT with an ON CONFLICT.
UNIQUE_CONFLICT: Final = "\nWHERE true ON CONFLICT DO NOTHING"
# The start of the current window of unique_for (%s ms): a multiple of its
# length on the database's clock, the same on every host.
UNIQUE_SLOT: Final = "{now} / %s * %s"


@functools.cache
def job_insert(*, extra_columns: str = "", extra_values: str = "", exact_time: bool = False) -> str:
    """The insert of one job with ``extra_columns`` (", a, b"), whose
    values, after the six of NewJob, are ``extra_values`` (", %s, %s" when
    not given). Due at a given time or after a delay (the time, or NULL and
    the delay, as the last two parameters), a time already past made now;
    or, ``exact_time``, due at exactly the time given (the last parameter),
    past or not. A unique job's insert (its columns name unique_key) writes
    nothing while another job holds its key."""
    if exact_time:
        run_at, due = "r.due", "CAST(%s AS BIGINT)"
    else:
        run_at, due = "{greatest}(r.due, r.now)", "COALESCE(%s, n.now + %s)"
    return compose(
        _INSERT,
        columns=INSERT_COLUMNS,
        extra_columns=extra_columns,
        extra_values=extra_values or ", %s" * extra_columns.count(","),
        run_at=run_at,
        due=due,
        on_conflict=UNIQUE_CONFLICT if "unique_key" in extra_columns else "",
    )


JOB_INSERT_SQL: Final = job_insert()

# A continuation, with {extra_columns} as job_insert's: its stage follows
# its parent's, read in the same statement without a lock (a caller's
# transaction left open must not hold up the parent's renewal or
# completion). A parent that finishes while the child's transaction is
# still open is caught by enqueue.settle_child after its commit. {parent}
# picks the parent row ``p`` it follows, {found} may refuse the insert.
_CONTINUATION_INSERT: Final = """
INSERT INTO later_job ({columns}{extra_columns}, finished_ms, expires_ms, last_error)
SELECT %s, p.namespace, %s, %s, p.child_stage, %s, 0, %s, p.id, {now}, {now}, {now},
       p.child_stage || '@' || {now} || ';'{extra_values},
       CASE WHEN p.child_stage = 'failed' THEN {now} END,
       CASE WHEN p.child_stage = 'failed' THEN {now} + %s END,
       CASE WHEN p.child_stage = 'failed' THEN '{parent_failed}' END
FROM (
    SELECT p.id, p.namespace, CASE p.stage
        WHEN 'success' THEN 'enqueued'
        WHEN 'failed' THEN 'failed'
        WHEN 'cancelled' THEN 'failed'
        ELSE 'waiting' END AS child_stage
    FROM {parent}
) p{found}{on_conflict}
RETURNING stage
"""
# The parent of a continuation of one parent: by id.
ONE_PARENT: Final = "later_job p WHERE p.id = %s AND p.namespace = %s"
# The parent a fan-in child follows, among the rows of later_fan_in written
# just before it (sql/fan_in.py): a failed or cancelled one (the child is
# stored failed), else an unfinished one, the one likely to finish last
# (not running, due last, newest), else a succeeded one (the child is ready).
FAN_IN_PARENT: Final = """later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = %s AND p.namespace = %s
    ORDER BY CASE p.stage WHEN 'failed' THEN 0 WHEN 'cancelled' THEN 0
        WHEN 'success' THEN 3 WHEN 'running' THEN 2 ELSE 1 END,
        p.run_at_ms DESC, p.id DESC
    LIMIT 1"""
# A fan-in child is written only if every parent listed exists in the namespace.
FAN_IN_FOUND: Final = """
WHERE NOT EXISTS (
    SELECT 1 FROM later_fan_in f WHERE f.child_id = %s
      AND NOT EXISTS (SELECT 1 FROM later_job q WHERE q.id = f.parent_id AND q.namespace = %s))"""


@functools.cache
def continuation_insert(
    *, extra_columns: str = "", extra_values: str = "", fan_in: bool = False
) -> str:
    """The insert of a continuation with ``extra_columns`` and their
    ``extra_values`` as job_insert's (their parameters after the five of
    the job's own, before the retention): of one parent (its id and
    namespace last), or, ``fan_in``, of the parents listed in later_fan_in
    (the child's id and namespace last, twice). A unique job's (its columns
    name unique_key; one parent only) writes nothing while its key is held."""
    return compose(
        _CONTINUATION_INSERT,
        columns=INSERT_COLUMNS,
        extra_columns=extra_columns,
        extra_values=extra_values or ", %s" * extra_columns.count(","),
        parent_failed=PARENT_FAILED,
        on_conflict=UNIQUE_CONFLICT if "unique_key" in extra_columns else "",
        parent=FAN_IN_PARENT if fan_in else ONE_PARENT,
        found=FAN_IN_FOUND if fan_in else "",
    )


# The job holding a unique key that an insert found taken: the unfinished
# job of the key, or (a window given) the job of the key in the current
# window. Each half reads one of migration 0015's unique indexes.
_UNIQUE_HOLDER: Final = """
SELECT id FROM later_job
WHERE namespace = %s AND type_name = %s AND unique_key = %s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')"""
UNIQUE_HOLDER_SQL: Final = _UNIQUE_HOLDER
UNIQUE_HOLDER_IN_WINDOW_SQL: Final = compose(
    """{holder}
UNION ALL
SELECT id FROM later_job
WHERE namespace = %s AND type_name = %s AND unique_key = %s AND unique_slot_ms = {slot}""",
    holder=_UNIQUE_HOLDER,
    slot=UNIQUE_SLOT,
)

# Whether a continuation's parent exists (an insert of a unique
# continuation that wrote nothing: its parent missing, or its key taken).
JOB_EXISTS_SQL: Final = "SELECT 1 FROM later_job WHERE id = %s AND namespace = %s"


# A continuation's parent, read after the continuation committed. The share
# lock (held for this one statement only) waits for a finish of the parent
# that is under way, so one of the two always sees the other.
JOB_PARENT_STAGE_SQL: Final = """
SELECT p.stage FROM later_job c JOIN later_job p ON p.id = c.parent_id
WHERE c.id = %s AND c.stage = 'waiting' {share_lock}
"""


# Tracing only: the enqueuing span's context, set in the enqueue's own
# transaction right after the insert, and read by the worker before the run.
# The statement-level counter trigger finds no stage change in it.
JOB_SET_TRACE_SQL: Final = "UPDATE later_job SET trace_context = %s WHERE id IN ({ids})"
