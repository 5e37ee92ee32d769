"""SQL of fan-in jobs (docs/how-to/fan-in.md): ``later_fan_in`` holds every parent
of a job enqueued after several; its ``later_job.parent_id`` names the one
it waits on now. Only fan-in jobs and their parents' failures read it: the
plain completion reads it only when a parent just done has a waiting child.

The recursive walks of a job's waiting (or revivable) descendants follow
both links, parent_id and later_fan_in; PostgreSQL allows one reference to
the recursive table per step, SQLite several, so each vendor writes them
its own way (postgresql.py, sqlite.py) from the parts here."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import CHILD_KEY_FREE, RELEASE, TO_FAILED
from later_django.states import PARENT_FAILED

TERMINAL: Final = "('success', 'failed', 'cancelled')"

# The parents of a child, written before the child's own row (whose insert
# reads them: sql/jobs.py FAN_IN_PARENT), in the same transaction.
FAN_IN_INSERT_SQL: Final = "INSERT INTO later_fan_in (child_id, parent_id) VALUES {pairs}"

# Parents of a refused child that do not exist in the namespace.
FAN_IN_MISSING_SQL: Final = """
SELECT f.parent_id FROM later_fan_in f WHERE f.child_id = %s
  AND NOT EXISTS (SELECT 1 FROM later_job p WHERE p.id = f.parent_id AND p.namespace = %s)
ORDER BY f.parent_id
"""

# The rows of children refused or pruned.
FAN_IN_DELETE_SQL: Final = "DELETE FROM later_fan_in WHERE child_id IN ({ids})"

# A waiting child's parents, read once its enqueue committed. The share
# lock waits for a finish of any of them that is under way, and holds off
# every later one until this transaction ends: each finish either committed
# before (and is seen here) or finds the child as this transaction left it.
# In id order, so two readers never wait on each other.
FAN_IN_PARENTS_OF_WAITING_SQL: Final = """
SELECT p.stage FROM later_job c
JOIN later_fan_in f ON f.child_id = c.id
JOIN later_job p ON p.id = f.parent_id
WHERE c.id = %s AND c.stage = 'waiting'
ORDER BY p.id {share_lock}
"""

# -- resolving waiting children: fail, release, or wait on another parent ----
# A parent listed but gone was pruned after it finished: a failed or
# cancelled one fails its fan-in children in the same transaction (or, at
# the latest, at the maintenance tick after), long before its retention
# ends, so a gone parent counts as succeeded.

# A parent failed or was cancelled: the child fails (its waiting
# descendants are failed next, by descendants.fail_descendants).
FAN_IN_FAIL_SQL: Final = compose(
    """
UPDATE later_job SET {to_failed}
WHERE id IN ({ids}) AND stage = 'waiting' AND EXISTS (
    SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage IN ('failed', 'cancelled'))
RETURNING id
""",
    to_failed=TO_FAILED,
)

# Every parent succeeded: due now.
FAN_IN_RELEASE_SQL: Final = compose(
    """
UPDATE later_job SET {release}
WHERE id IN ({ids}) AND stage = 'waiting' AND NOT EXISTS (
    SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage <> 'success')
""",
    release=RELEASE,
)

# The unfinished parents of a child, the one to wait on first: one not
# running (it cannot be finishing at this moment, so its finish will see
# the child), due last, newest.
_UNFINISHED_PARENTS: Final = """later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage NOT IN {terminal}"""
UNFINISHED_PARENTS: Final = compose(_UNFINISHED_PARENTS, terminal=TERMINAL)

# A child whose parent finished (or is gone) while another has not: it
# waits on that one, whose finish then resolves it. One already waiting
# on an unfinished parent is left as it is.
FAN_IN_REPOINT_SQL: Final = compose(
    """
UPDATE later_job SET parent_id = (
    SELECT p.id FROM {unfinished}
    ORDER BY CASE p.stage WHEN 'running' THEN 1 ELSE 0 END, p.run_at_ms DESC, p.id DESC
    LIMIT 1)
WHERE id IN ({ids}) AND stage = 'waiting'
  AND NOT EXISTS (
    SELECT 1 FROM later_job w WHERE w.id = later_job.parent_id AND w.stage NOT IN {terminal})
  AND EXISTS (SELECT 1 FROM {unfinished})
""",
    unfinished=UNFINISHED_PARENTS,
    terminal=TERMINAL,
)

# -- walking descendants (the vendors' statements are made of these) ---------
# A child ``c`` that waits on the job at {parent}, by either link.
WAITING_CHILD: Final = "c.stage = 'waiting'"
# A child ``c`` that failed because a parent did, and waits again when that
# parent is retried. A partition job is left failed: its partition has
# moved on, and waiting again would put it back in front of the jobs
# behind it. So is a unique job whose key another unfinished job took
# meanwhile (and its own descendants with it): the key is that job's.
REVIVABLE_CHILD: Final = compose(
    "c.stage = 'failed' AND c.last_error = '{parent_failed}' AND c.topic IS NULL AND {key_free}",
    parent_failed=PARENT_FAILED,
    key_free=CHILD_KEY_FREE,
)
# The same, of children without a unique key only: what a retry revives when
# reviving the others would give one key to two jobs (two failed
# continuations that share a key, or an enqueue that took it meanwhile).
REVIVABLE_KEYLESS_CHILD: Final = compose("{child} AND c.unique_key IS NULL", child=REVIVABLE_CHILD)
