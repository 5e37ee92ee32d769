"""SQL only PostgreSQL runs: its clock, the SKIP LOCKED claim, COPY, the batch
completion function, the statement-level counter triggers with NOTIFY, and
the counter folding. Shared statements are in the domain modules."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose

# The channel the counter triggers NOTIFY and the worker LISTENs on.
NOTIFY_CHANNEL: Final = "later"
# Partition jobs that became ready: partition pollers listen here, plain
# workers never hear of them.
PARTITION_CHANNEL: Final = "later_partition"


# -- clock and locking fragments (see __init__.py) -----------------------------
# statement_timestamp(): one time for the whole statement, so every column a
# write stamps agrees (clock_timestamp() is read anew per column and row), and
# stable, so the planner can search an index with it. A statement that waited
# for a row lock is still stamped after the write it waited for: a stage
# change is GREATEST(now, changed_ms). date_part() is double precision: far
# cheaper than extract()'s numeric, and exact to the millisecond for any date
# a job can have.
NOW_SQL: Final = "(date_part('epoch', statement_timestamp()) * 1000)::bigint"
SKIP_LOCKED: Final = "FOR UPDATE SKIP LOCKED"
SHARE_LOCK: Final = "FOR SHARE OF p"

# -- jobs -----------------------------------------------------------------------
# The columns a COPY of ready jobs carries; the times and the history entry
# are the columns' defaults (migration 0002), the database's clock at the
# COPY's start.
COPY_COLUMNS: Final = "id, namespace, type_name, payload, stage, priority, attempts, retry_policy"
JOB_COPY_SQL: Final = compose("COPY later_job ({columns}) FROM STDIN", columns=COPY_COLUMNS)
# The same, of a batch in which some job names a queue.
JOB_COPY_QUEUED_SQL: Final = compose(
    "COPY later_job ({columns}, queue) FROM STDIN", columns=COPY_COLUMNS
)
