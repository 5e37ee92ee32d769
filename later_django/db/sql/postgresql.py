"""PostgreSQL's words for the database's clock ({now}) and its row locks
({skip_locked}, {share_lock}), and its wake-up channels. Its own statements
stand beside SQLite's in the modules of their concern (``NAME_PG``)."""

from __future__ import annotations

from typing import Final

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
