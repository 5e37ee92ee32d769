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
