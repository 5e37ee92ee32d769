"""The dashboard's actions on jobs: one job at a time, or every job a list's
filter matches, a page at a time within a time budget (a filter matching a
million jobs is worked through by pressing again, never by one request that
holds the database for minutes). Each job's change is its own transaction."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from django.db import connections, transaction

from later_django.conf import conf
from later_django.dashboard import reads
from later_django.db import dialect_for
from later_django.db.rows import JobQuery
from later_django.enqueue import cancel
from later_django.partitions.api import force_fail_partition_head

ACTIONS = {
    "retry": "retried",
    "cancel": "cancelled",
    "run_now": "made due now",
    "force_fail": "force-failed",
}
BULK_PAGE = 200
BULK_BUDGET_SECONDS = 5.0


@dataclass(slots=True)
class Result:
    """What an action did: ``done`` jobs changed; ``skipped`` ones were not
    in a stage the action applies to (finished meanwhile, say); ``revived``
    continuations wait again for a retried parent; ``more`` says a bulk
    action stopped at its time budget with matching jobs left."""

    action: str
    done: int = 0
    skipped: list[str] = field(default_factory=list)
    revived: int = 0
    more: bool = False

    def message(self) -> str:
        text = f"{self.done} job{'s' if self.done != 1 else ''} {ACTIONS[self.action]}"
        if self.revived:
            text += (
                f"; {self.revived} continuation{'s' if self.revived != 1 else ''} that had "
                "failed with 'parent failed' wait for it again"
            )
        if self.skipped:
            text += f"; {len(self.skipped)} left as they were ({_why_skipped(self.action)})"
        if self.more:
            text += "; more jobs match the filter: run the action again to go on"
        return text + "."


def _why_skipped(action: str) -> str:
    return {
        "retry": "only a failed job that is not a partition job can be retried",
        "cancel": "only a job that has not started can be cancelled",
        "run_now": "only a delayed or requeued job can be made due",
        "force_fail": "only the head of its partition can be force-failed",
    }[action]


def apply(action: str, job_ids: list[str]) -> Result:
    result = Result(action)
    for job_id in job_ids:
        _apply_one(action, job_id, result)
    return result


def apply_matching(action: str, query: JobQuery) -> Result:
    """``action`` on every job ``query``'s list holds, page by page, until
    the list ends or the time budget is spent."""
    result = Result(action)
    deadline = time.monotonic() + BULK_BUDGET_SECONDS
    query = replace(query, page_size=BULK_PAGE)
    while True:
        page = reads.job_page(query)
        for job in page.jobs:
            _apply_one(action, job.id, result)
        if page.after is None:
            return result
        if time.monotonic() >= deadline:
            result.more = True
            return result
        query = replace(query, after=page.after)


def _apply_one(action: str, job_id: str, result: Result) -> None:
    alias, namespace = conf.database, conf.namespace
    dialect = dialect_for(alias)
    if action == "cancel":
        changed = cancel(job_id)
    elif action == "force_fail":
        changed = _force_fail(job_id)
    else:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            if action == "run_now":
                changed = dialect.job_run_now(cursor, namespace=namespace, job_id=job_id)
            else:
                revived = dialect.job_retry_failed(cursor, namespace=namespace, job_id=job_id)
                changed = revived is not None
                result.revived += revived or 0
    if changed:
        result.done += 1
    else:
        result.skipped.append(job_id)


def _force_fail(job_id: str) -> bool:
    job = reads.job_detail(job_id)
    if job is None or job["topic"] is None:
        return False
    try:
        return force_fail_partition_head(job["topic"], job["partition"], job_id=job_id) is not None
    except ValueError:
        return False  # its topic is no longer configured
