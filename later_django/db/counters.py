"""Operations on ``later_stage_count``: exact counts per stage, kept by
triggers in the same transaction as every change of a job."""

from __future__ import annotations

import abc

from django.db.backends.utils import CursorWrapper

from later_django.db.sql import counters as counters_sql
from later_django.db.statements import Statements
from later_django.states import Stage


class CounterOperations(Statements):
    """Counts per stage, and folding their rows."""

    def stage_counts(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, int]:
        """The number of jobs of ``namespace`` per stage, every stage present."""
        cursor.execute(self._sql(counters_sql.STAGE_COUNTS_SQL), [namespace])
        counts = {stage.value: 0 for stage in Stage}
        for stage, n in cursor.fetchall():
            counts[stage] = int(n)
        return counts

    def plain_ready(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Plain jobs of ``namespace`` ready to run now."""
        cursor.execute(self._sql(counters_sql.PLAIN_READY_SQL), [namespace])
        return int(cursor.fetchone()[0])

    @abc.abstractmethod
    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Fold the counter rows of ``namespace`` together; return how many
        rows were folded."""
