"""later's SQL text: one module per domain, and one per vendor for what only it runs.

Nothing here runs a statement or imports runtime code. Statements are
templates; Dialect._sql() fills in, once per vendor:

    {now}          the database's clock in epoch ms, one value for the whole
                   statement (an index search can use it as a bound)
    {stamp}        the time of a stage change (STAMP)
    {greatest}     the larger of two values (GREATEST, or SQLite's MAX)
    {skip_locked}  appended to SELECTs that pick rows to change, where the
                   vendor locks rows
    {share_lock}   appended to a read that must wait for a concurrent write

Per-call parts ({ids}, {pairs}, {limit}, {values}) are left for the operation.

Every time written or compared is the database's, never a host's, so hosts
with skewed clocks agree on when a lease expires or a job is due, and a
stage's time is taken when its write runs, not before it waited for a lock.
"""

from __future__ import annotations

from typing import Final

# later's tables, as its migrations create them.
TABLES: Final = (
    "later_job",
    "later_stage_count",
    "later_server",
    "later_maintenance",
    "later_topic",
    "later_lease",
    "later_schedule",
    "later_task_result",
    "later_partition_seq",
    "later_partition",
    "later_log_topic",
    "later_log_partition",
    "later_log_record",
    "later_log_consumer",
    "later_dashboard_stat",
    "later_queue_sample",
)

# The time of a stage change: never before the row's previous change, so a
# job's history never goes backwards (two writers' clocks, or a writer that
# waited).
STAMP: Final = "{greatest}({now}, changed_ms)"
