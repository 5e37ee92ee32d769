"""Operations on ``later_task_result`` (the Django Tasks backend's results)."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import TaskAttemptEnd
from later_django.db.sql import tasks as tasks_sql
from later_django.db.statements import Statements


class TaskResultOperations(Statements):
    """Task results: written once per attempt, at its end."""

    def task_result_save(self, cursor: CursorWrapper, end: TaskAttemptEnd) -> bool:
        """Store the end of an attempt of a task job; return False when the
        job is no longer at that attempt (nothing is stored)."""
        cursor.execute(
            tasks_sql.TASK_RESULT_SAVE_SQL,
            [end.earlier_workers, end.errors, end.return_value, end.job_id, end.attempt],
        )
        return bool(cursor.rowcount == 1)
