"""Operations on ``later_task_result`` (the Django Tasks backend's results)."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.sql import tasks as tasks_sql
from later_django.db.statements import Statements


class TaskResultOperations(Statements):
    """Task results: written once per attempt, at its end."""

    def task_result_save(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        attempt: int,
        earlier_workers: str,
        errors: str,
        return_value: str | None,
    ) -> bool:
        """Store the end of ``attempt`` of a task job: ``earlier_workers`` is
        the JSON of the worker ids before it without its closing bracket
        (``'['`` or ``'["a",'``), to which the lease holder's id is added.
        Return False when the job is no longer at that attempt."""
        cursor.execute(
            tasks_sql.TASK_RESULT_SAVE_SQL, [earlier_workers, errors, return_value, job_id, attempt]
        )
        return bool(cursor.rowcount == 1)
