"""SQL of ``later_server`` (one row per running worker process),
``later_queue`` (queue pauses), ``later_maintenance`` (when an interval-gated
step last ran) and ``later_lease`` (who leads a cluster-wide duty)."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Record that a server runs now, registering it the first time.
SERVER_HEARTBEAT: Final = Statement("""
INSERT INTO later_server (id, namespace, hostname, pid, workers, topics, queues, version,
    started_ms, heartbeat_ms)
VALUES (%(server_id)s, %(namespace)s, %(hostname)s, %(pid)s, %(workers)s, %(topics)s,
    %(queues)s, %(version)s, {now}, {now})
ON CONFLICT (id) DO UPDATE SET workers = excluded.workers, topics = excluded.topics,
    queues = excluded.queues, version = excluded.version, heartbeat_ms = excluded.heartbeat_ms
""")

# A server that stops.
SERVER_REMOVE: Final = Statement("DELETE FROM later_server WHERE id = %(server_id)s")

# Servers silent for longer than silent_for_ms.
SERVER_PRUNE: Final = Statement("""
DELETE FROM later_server
WHERE namespace = %(namespace)s AND heartbeat_ms < {now} - %(silent_for_ms)s
""")

# -- queues (later_queue) ------------------------------------------------------------
# Pause a queue: its row is made on its first pause; the pause holds once
# this commits, whichever server claims next. A row when it was running.
QUEUE_PAUSE: Final = Statement("""
INSERT INTO later_queue (namespace, name, paused, changed_ms)
VALUES (%(namespace)s, %(name)s, TRUE, {now})
ON CONFLICT (namespace, name) DO UPDATE SET paused = TRUE, changed_ms = excluded.changed_ms
WHERE NOT later_queue.paused
RETURNING 1
""")

# Resume a paused queue (a row count of 1 when it was paused).
QUEUE_RESUME: Final = Statement("""
UPDATE later_queue SET paused = FALSE, changed_ms = {now}
WHERE namespace = %(namespace)s AND name = %(name)s AND paused
""")

# The queues paused now.
QUEUE_PAUSED: Final = Statement(
    "SELECT name FROM later_queue WHERE namespace = %(namespace)s AND paused"
)

# -- the maintenance gate (later_maintenance) ---------------------------------------------
# Record that a step runs now unless it ran less than interval_ms ago
# anywhere in the namespace: a row for the caller that should run it.
MAINTENANCE_CLAIM: Final = Statement("""
INSERT INTO later_maintenance (namespace, step, last_run_ms)
VALUES (%(namespace)s, %(step)s, {now})
ON CONFLICT (namespace, step) DO UPDATE SET last_run_ms = excluded.last_run_ms
WHERE later_maintenance.last_run_ms <= {now} - %(interval_ms)s
RETURNING 1
""")

# -- named leases (later_lease), by the lease rule of leases.py ----------------------
# Take or keep a named lease (the lease rule's take): the live holder's take
# is its renewal and keeps its epoch; a new holder gets the next one. The
# epoch, or no row while another owner holds it.
LEASE_ACQUIRE: Final = Statement("""
INSERT INTO later_lease (namespace, name, owner, epoch, expires_ms)
VALUES (%(namespace)s, %(name)s, %(owner)s, 1, {now} + %(ttl_ms)s)
ON CONFLICT (namespace, name) DO UPDATE SET
    epoch = later_lease.epoch
        + CASE WHEN later_lease.owner = excluded.owner AND later_lease.expires_ms >= {now}
          THEN 0 ELSE 1 END,
    owner = excluded.owner, expires_ms = excluded.expires_ms
WHERE later_lease.owner IS NULL OR later_lease.owner = excluded.owner
   OR later_lease.expires_ms < {now}
RETURNING epoch
""")

# Let a lease go now if it is still at the epoch its holder took (the lease
# rule's release): expired at once, the row (and its epoch) kept.
LEASE_RELEASE: Final = Statement("""
UPDATE later_lease SET expires_ms = 0
WHERE namespace = %(namespace)s AND name = %(name)s AND epoch = %(epoch)s
""")
