"""SQL of the enqueue (``dialect.enqueue``): the inserts of jobs — one, many,
a continuation, a unique job, a fan-in child and its parent list — the
reads that follow a unique insert that wrote nothing, and the settling of a
child after its commit.

Fan-in jobs (docs/how-to/fan-in.md): ``later_fan_in`` holds every parent of
a job enqueued after several; its ``later_job.parent_id`` names the one it
waits on now. Only fan-in jobs and their parents' failures read it.
"""

from __future__ import annotations

import functools
from typing import Final

from later_django.db.sql import Statement, compose

# One job without options, delayed or ready by the database's clock: due
# at run_at_ms or delay_ms after now, a time already past made now (r.due
# is the time asked for, r.now the clock); its stage.
INSERT: Final = Statement("""
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history)
SELECT %(job_id)s, %(namespace)s, %(type_name)s, %(payload)s, t.stage, %(priority)s, 0,
    %(retry_policy)s, NULL, t.now, t.run_at, t.now, t.stage || '@' || t.now || ';'
FROM (
    SELECT r.now, {greatest}(r.due, r.now) AS run_at,
        CASE WHEN r.due > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (SELECT n.now, COALESCE(%(run_at_ms)s, n.now + %(delay_ms)s) AS due
          FROM (SELECT {now} AS now) n) r
) t
RETURNING stage
""")

# -- jobs that set options: one text per combination of option columns --------------
# An insert names only the option columns its job sets, so a job that sets
# none is written as before the options existed (INSERT: a web server of
# this release still enqueues plain jobs before later_migrate added them).
# The inserts of jobs with options are therefore made here from INSERT's
# and CONTINUATION's parts, one text per combination, cached: a change to
# one must change every combination alike. Each option column's value, in
# the order an insert names them; a window of unique_for_ms starts at a
# multiple of its length on the database's clock, the same on every host.
OPTION_VALUES: Final = {
    "topic": "%(topic)s",
    "partition": "%(partition)s",
    "sequence": "%(sequence)s",
    "timeout_ms": "%(timeout_ms)s",
    "queue": "%(queue)s",
    "concurrency_key": "%(concurrency_key)s",
    "concurrency_limit": "%(concurrency_limit)s",
    "unique_key": "%(unique_key)s",
    "unique_slot_ms": "{now} / %(unique_for_ms)s * %(unique_for_ms)s",
}
# A job with a unique key is not written while another holds the key (a
# unique index of migration 0015 says so): the insert then returns no row.
# The WHERE lets SQLite read an INSERT ... SELECT with an ON CONFLICT.
UNIQUE_CONFLICT: Final = "\nWHERE true ON CONFLICT DO NOTHING"


@functools.cache
def insert_with_options(columns: tuple[str, ...]) -> Statement:
    """INSERT naming the option ``columns`` too (OPTION_VALUES' names);
    one with unique_key writes nothing while another job holds its key."""
    return Statement(
        compose(
            """
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history{columns})
SELECT %(job_id)s, %(namespace)s, %(type_name)s, %(payload)s, t.stage, %(priority)s, 0,
    %(retry_policy)s, NULL, t.now, t.run_at, t.now, t.stage || '@' || t.now || ';'{values}
FROM (
    SELECT r.now, {greatest}(r.due, r.now) AS run_at,
        CASE WHEN r.due > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (SELECT n.now, COALESCE(%(run_at_ms)s, n.now + %(delay_ms)s) AS due
          FROM (SELECT {now} AS now) n) r
) t{on_conflict}
RETURNING stage""",
            **_options(columns),
        )
    )


@functools.cache
def continuation_with_options(columns: tuple[str, ...], *, fan_in: bool = False) -> Statement:
    """A continuation naming the option ``columns`` (none: a plain one).

    Its stage follows its parent's, read in the same statement without a
    lock (a caller's transaction left open must not hold up the parent's
    renewal or completion); a parent that finishes while the child's
    transaction is still open is caught by settle_child after its commit.
    A child of a failed or cancelled parent is stored failed ('parent
    failed': states.PARENT_FAILED), kept retention_ms. Of one parent
    (parent_id), or, ``fan_in``, of the parents listed in later_fan_in just
    before: it follows a failed or cancelled one (it is stored failed), else
    an unfinished one, the one likely to finish last (not running, due
    last, newest), else a succeeded one (it is ready); and it is written
    only if every parent listed exists in the namespace."""
    if fan_in:
        parent = """later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = %(job_id)s AND p.namespace = %(namespace)s
    ORDER BY CASE p.stage WHEN 'failed' THEN 0 WHEN 'cancelled' THEN 0
        WHEN 'success' THEN 3 WHEN 'running' THEN 2 ELSE 1 END,
        p.run_at_ms DESC, p.id DESC
    LIMIT 1"""
        found = """
WHERE NOT EXISTS (
    SELECT 1 FROM later_fan_in f WHERE f.child_id = %(job_id)s
      AND NOT EXISTS (
        SELECT 1 FROM later_job q WHERE q.id = f.parent_id AND q.namespace = %(namespace)s))"""
    else:
        parent = "later_job p WHERE p.id = %(parent_id)s AND p.namespace = %(namespace)s"
        found = ""
    return Statement(
        compose(
            """
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history{columns},
    finished_ms, expires_ms, last_error)
SELECT %(job_id)s, p.namespace, %(type_name)s, %(payload)s, p.child_stage, %(priority)s, 0,
    %(retry_policy)s, p.id, {now}, {now}, {now}, p.child_stage || '@' || {now} || ';'{values},
    CASE WHEN p.child_stage = 'failed' THEN {now} END,
    CASE WHEN p.child_stage = 'failed' THEN {now} + %(retention_ms)s END,
    CASE WHEN p.child_stage = 'failed' THEN 'parent failed' END
FROM (
    SELECT p.id, p.namespace, CASE p.stage
        WHEN 'success' THEN 'enqueued'
        WHEN 'failed' THEN 'failed'
        WHEN 'cancelled' THEN 'failed'
        ELSE 'waiting' END AS child_stage
    FROM {parent}
) p{found}{on_conflict}
RETURNING stage
""",
            parent=parent,
            found=found,
            **_options(columns),
        )
    )


def _options(columns: tuple[str, ...]) -> dict[str, str]:
    return {
        "columns": "".join(", " + column for column in columns),
        "values": "".join(", " + OPTION_VALUES[column] for column in columns),
        "on_conflict": UNIQUE_CONFLICT if "unique_key" in columns else "",
    }


# -- after a unique insert that wrote nothing ---------------------------------------
# The job holding the key: the unfinished job of the key (migration 0015's
# index of unfinished keys).
UNIQUE_HOLDER: Final = Statement("""
SELECT id FROM later_job
WHERE namespace = %(namespace)s AND type_name = %(type_name)s AND unique_key = %(unique_key)s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')
""")
# A key with a window: the unfinished job of the key, or the job of the key
# in the current window (each half reads one of migration 0015's indexes).
UNIQUE_HOLDER_IN_WINDOW: Final = Statement("""
SELECT id FROM later_job
WHERE namespace = %(namespace)s AND type_name = %(type_name)s AND unique_key = %(unique_key)s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')
UNION ALL
SELECT id FROM later_job
WHERE namespace = %(namespace)s AND type_name = %(type_name)s AND unique_key = %(unique_key)s
  AND unique_slot_ms = {now} / %(unique_for_ms)s * %(unique_for_ms)s
""")

# Whether a continuation's parent exists (an insert of a unique
# continuation that wrote nothing: its parent missing, or its key taken).
PARENT_EXISTS: Final = Statement(
    "SELECT 1 FROM later_job WHERE id = %(parent_id)s AND namespace = %(namespace)s"
)

# -- fan-in children's parent lists (later_fan_in) ----------------------------------
# The parents of a child, written before the child's own row (whose insert
# reads them), in the same transaction: (child_id, parent_id) pairs.
FAN_IN_ADD: Final = Statement(
    "INSERT INTO later_fan_in (child_id, parent_id) VALUES %(pairs)s", lists=("pairs",)
)

# Parents of a refused child that do not exist in the namespace.
FAN_IN_MISSING: Final = Statement("""
SELECT f.parent_id FROM later_fan_in f WHERE f.child_id = %(job_id)s
  AND NOT EXISTS (
    SELECT 1 FROM later_job p WHERE p.id = f.parent_id AND p.namespace = %(namespace)s)
ORDER BY f.parent_id
""")

# The parent list of a refused child.
FAN_IN_FORGET: Final = Statement("DELETE FROM later_fan_in WHERE child_id = %(job_id)s")

# -- settling a child after its commit ------------------------------------------------
# A continuation's parent, read after the continuation committed. The share
# lock (held for this one statement only) waits for a finish of the parent
# that is under way, so one of the two always sees the other.
PARENT_STAGE: Final = Statement("""
SELECT p.stage FROM later_job c JOIN later_job p ON p.id = c.parent_id
WHERE c.id = %(job_id)s AND c.stage = 'waiting' {share_lock}
""")

# A waiting fan-in child's parents, read once its enqueue committed. The
# share lock waits for a finish of any of them that is under way, and holds
# off every later one until this transaction ends: each finish either
# committed before (and is seen here) or finds the child as this
# transaction left it. In id order, so two readers never wait on each other.
FAN_IN_PARENTS_OF_WAITING: Final = Statement("""
SELECT p.stage FROM later_job c
JOIN later_fan_in f ON f.child_id = c.id
JOIN later_job p ON p.id = f.parent_id
WHERE c.id = %(job_id)s AND c.stage = 'waiting'
ORDER BY p.id {share_lock}
""")

# -- tracing (LATER["TRACING"] only) --------------------------------------------------
# The enqueuing span's context, set in the enqueue's own transaction right
# after the insert, and read by the worker before the run. The
# statement-level counter trigger finds no stage change in it.
SET_TRACE: Final = Statement(
    "UPDATE later_job SET trace_context = %(context)s WHERE id IN (%(job_ids)s)",
    lists=("job_ids",),
)

# -- in bulk ------------------------------------------------------------------------
# PostgreSQL streams ready jobs with COPY: the times and the history entry
# are the columns' defaults (migration 0002), the database's clock at the
# COPY's start.
COPY_PG: Final = Statement("""
COPY later_job (id, namespace, type_name, payload, stage, priority, attempts, retry_policy)
FROM STDIN
""")
# The same, of a batch in which some job names a queue.
COPY_QUEUED_PG: Final = Statement("""
COPY later_job (id, namespace, type_name, payload, stage, priority, attempts, retry_policy,
    queue)
FROM STDIN
""")

# SQLite: ready jobs in one multi-row INSERT; a row is NewJob's first six
# fields (id, namespace, type_name, payload, priority, retry_policy), the
# rest the clock, read once.
INSERT_MANY_SQLITE: Final = Statement(
    """
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history)
SELECT v.column1, v.column2, v.column3, v.column4, 'enqueued', v.column5, 0, v.column6, NULL,
    n.now, n.now, n.now, 'enqueued@' || n.now || ';'
FROM (VALUES %(rows)s) v, (SELECT {now} AS now) n
""",
    lists=("rows",),
)
# The same, of a batch in which some job names a queue: each row then ends
# with its queue's column value ('' for the default one).
INSERT_MANY_QUEUED_SQLITE: Final = Statement(
    """
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history, queue)
SELECT v.column1, v.column2, v.column3, v.column4, 'enqueued', v.column5, 0, v.column6, NULL,
    n.now, n.now, n.now, 'enqueued@' || n.now || ';', v.column7
FROM (VALUES %(rows)s) v, (SELECT {now} AS now) n
""",
    lists=("rows",),
)
# One job due now that sets no option (insert_one's common case on
# SQLite): its stage is known, so it is a plain insert of one row, with
# nothing to compute and nothing to return; INSERT's sub-selects and
# RETURNING would cost SQLite about a fifth more.
INSERT_READY_SQLITE: Final = Statement("""
INSERT INTO later_job (id, namespace, type_name, payload, stage, priority, attempts,
    retry_policy, parent_id, created_ms, run_at_ms, changed_ms, history)
VALUES (%(job_id)s, %(namespace)s, %(type_name)s, %(payload)s, 'enqueued', %(priority)s, 0,
    %(retry_policy)s, NULL, {now}, {now}, {now}, 'enqueued@' || {now} || ';')
""")
