"""SQL of the limits across every server (docs/how-to/rate-limits.md,
docs/how-to/concurrency-limits.md): a rate-limited queue's window in
``later_queue``, and the pick of a claim that keeps concurrency keys.

A queue without limits never runs any of it: its claim is the plain one
(postgresql.py, sqlite.py). The vendors wrap KEYED_PICK in their own claim
statement.
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# -- rate limits (later_queue) ---------------------------------------------------------
# The queue's row, locked to the end of the claim's transaction (written on
# first use), and the window the claim counts in. The claim's own window is
# the current one: [start, end), multiples of its length (%s ms) since the
# epoch on the database's clock (integer division aligns it on both
# databases). Windows of a second, a minute and an hour nest, so the
# claim's window and the row's nest or one lies after the other:
# - the claim's starts at or after the row's end (or the row has none): it
#   replaces the row's, and the count starts again at 0;
# - the claim's ends at or before the row's end: the row's window and count
#   stay. It lies inside the row's (a smaller unit), or before it: on
#   PostgreSQL the clock is read when the statement starts, before it waits
#   for the row, and a newer window may have been written meanwhile;
# - else the claim's contains the row's (a larger unit): the row's window
#   widens to the claim's, and keeps its count.
# So a window never moves back, and a count is reset only once its window
# has ended. Returns the row's window's end, the starts in it and the clock.
RATE_WINDOW: Final = Statement("""
INSERT INTO later_queue
    (namespace, name, paused, changed_ms, rate_window_ms, rate_window_end_ms, rate_started)
VALUES (%(namespace)s, %(queue)s, FALSE, {now}, ({now} / %(window_ms)s) * %(window_ms)s,
    ({now} / %(window_ms)s + 1) * %(window_ms)s, 0)
ON CONFLICT (namespace, name) DO UPDATE SET
    rate_started = CASE WHEN later_queue.rate_window_end_ms > excluded.rate_window_ms
        THEN later_queue.rate_started ELSE 0 END,
    rate_window_ms = CASE WHEN later_queue.rate_window_end_ms >= excluded.rate_window_end_ms
        THEN later_queue.rate_window_ms ELSE excluded.rate_window_ms END,
    rate_window_end_ms = CASE WHEN later_queue.rate_window_end_ms >= excluded.rate_window_end_ms
        THEN later_queue.rate_window_end_ms ELSE excluded.rate_window_end_ms END
RETURNING rate_window_end_ms, rate_started, {now}
""")

# The starts a claim just made, counted in the window RATE_WINDOW locked
# (in the same transaction).
RATE_COUNT: Final = Statement("""
UPDATE later_queue SET rate_started = rate_started + %(started)s
WHERE namespace = %(namespace)s AND name = %(queue)s
RETURNING rate_started
""")

# Each queue's window as it stands (its end), for the dashboard and the
# metrics: a read.
RATE_WINDOWS: Final = Statement("""
SELECT name, rate_window_end_ms, rate_started FROM later_queue
WHERE namespace = %(namespace)s AND rate_window_end_ms IS NOT NULL
""")

# -- concurrency keys ------------------------------------------------------------------
# SQLite's wake-up check of a keyed queue: is one of its first ready jobs
# (100 of them) below its key's limit? Bounded, so a backlog of
# one key at its limit costs every commit's look no more than that; a job
# further on is found by the workers' poll.
# The namespace's running keyed jobs by key (busy) are read once, through
# the partial index later_job_keyed_running (every queue's: a key is shared
# by every job of the namespace that has it). queue_column: the queue's
# value of later_job.queue; queue: its name in later_queue (a paused queue
# has nothing ready).
KEYED_READY_EXISTS: Final = Statement("""
WITH busy AS MATERIALIZED (
    SELECT concurrency_key AS k, COUNT(*) AS n FROM later_job
    WHERE namespace = %(namespace)s AND stage = 'running' AND concurrency_key IS NOT NULL
    GROUP BY concurrency_key)
SELECT 1 FROM (
    SELECT j.concurrency_key, j.concurrency_limit FROM later_job j
    WHERE namespace = %(namespace)s AND queue = %(queue_column)s AND stage = 'enqueued'
      AND topic IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM later_queue q
          WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
    ORDER BY j.priority DESC, j.id
    LIMIT 100
) c
WHERE NOT EXISTS (
    SELECT 1 FROM busy b WHERE b.k = c.concurrency_key AND b.n >= c.concurrency_limit)
LIMIT 1
""")

# The ready jobs of a queue whose key is at its limit: each busy key's ready
# jobs through the partial index later_job_keyed_ready. Plain jobs and keys
# with a free slot are never read.
KEYED_HELD: Final = Statement("""
WITH busy AS MATERIALIZED (
    SELECT concurrency_key AS k, COUNT(*) AS n FROM later_job
    WHERE namespace = %(namespace)s AND stage = 'running' AND concurrency_key IS NOT NULL
    GROUP BY concurrency_key)
SELECT COUNT(*) FROM busy b JOIN later_job j ON j.concurrency_key = b.k
WHERE j.namespace = %(namespace)s AND j.stage = 'enqueued' AND j.concurrency_key IS NOT NULL
  AND j.queue = %(queue_column)s AND j.topic IS NULL AND j.concurrency_limit <= b.n
""")
