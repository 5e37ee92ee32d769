"""SQL of ``later_server`` (one row per running worker process) and
``later_maintenance`` (when an interval-gated step last ran)."""

from __future__ import annotations

from typing import Final

SERVER_HEARTBEAT_SQL: Final = """
INSERT INTO later_server (id, namespace, hostname, pid, workers, topics, queues, version,
    started_ms, heartbeat_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, {now}, {now})
ON CONFLICT (id) DO UPDATE SET workers = excluded.workers, topics = excluded.topics,
    queues = excluded.queues, version = excluded.version, heartbeat_ms = excluded.heartbeat_ms
"""

# -- queues (later_queue) ------------------------------------------------------------
# Pausing writes the queue's row, made on its first pause; it is true once
# this commits, whichever server claims next.
QUEUE_PAUSE_SQL: Final = """
INSERT INTO later_queue (namespace, name, paused, changed_ms) VALUES (%s, %s, TRUE, {now})
ON CONFLICT (namespace, name) DO UPDATE SET paused = TRUE, changed_ms = excluded.changed_ms
WHERE NOT later_queue.paused
RETURNING 1
"""
QUEUE_RESUME_SQL: Final = """
UPDATE later_queue SET paused = FALSE, changed_ms = {now}
WHERE namespace = %s AND name = %s AND paused
"""
QUEUE_PAUSED_SQL: Final = "SELECT name FROM later_queue WHERE namespace = %s AND paused"

SERVER_REMOVE_SQL: Final = "DELETE FROM later_server WHERE id = %s"

SERVER_PRUNE_SQL: Final = """
DELETE FROM later_server WHERE namespace = %s AND heartbeat_ms < {now} - %s
"""

MAINTENANCE_CLAIM_SQL: Final = """
INSERT INTO later_maintenance (namespace, step, last_run_ms) VALUES (%s, %s, {now})
ON CONFLICT (namespace, step) DO UPDATE SET last_run_ms = excluded.last_run_ms
WHERE later_maintenance.last_run_ms <= {now} - %s
RETURNING 1
"""
