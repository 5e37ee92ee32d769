"""SQL only SQLite runs: its clock, the claim and batch completion of one
writer at a time, multi-row inserts, the row-level counter triggers and its
PRAGMAs. Shared statements are in the domain modules."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import (
    INSERT_COLUMNS,
)

# -- clock fragment (see __init__.py) -------------------------------------------
# julianday('now') has millisecond precision and one value per statement
# step; the 3.40 library here lacks unixepoch('subsec').
NOW_SQL: Final = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"

# -- jobs -----------------------------------------------------------------------
# Ready jobs in bulk: a row carries NewJob's first six fields (id, namespace,
# type_name, payload, priority, retry_policy); the rest is the clock.
JOB_INSERT_MANY_ROW: Final = (
    "(%s, %s, %s, %s, 'enqueued', %s, 0, %s, NULL, {now}, {now}, {now}, "
    "'enqueued@' || {now} || ';')"
)
JOB_INSERT_MANY_SQL: Final = compose(
    "INSERT INTO later_job ({columns}) VALUES {values}", columns=INSERT_COLUMNS
)
# One job due now that sets no option (insert_one's common case): its stage
# is known, so it is the bulk insert of one row, with nothing to compute and
# nothing to return. jobs.JOB_INSERT_SQL's sub-selects and RETURNING would
# cost SQLite about a fifth more.
JOB_INSERT_READY_SQL: Final = compose(JOB_INSERT_MANY_SQL, values=JOB_INSERT_MANY_ROW)
# The same, of a batch in which some job names a queue: each row then ends
# with its queue (NULL for the default one).
JOB_INSERT_MANY_QUEUED_ROW: Final = JOB_INSERT_MANY_ROW[:-1] + ", %s)"
JOB_INSERT_MANY_QUEUED_SQL: Final = compose(
    "INSERT INTO later_job ({columns}, queue) VALUES {values}", columns=INSERT_COLUMNS
)
