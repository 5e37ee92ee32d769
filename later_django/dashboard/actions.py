"""The dashboard's actions: on one job, or on every job a list's filter
matches, a page at a time within a time budget (pressed again for the rest,
never one request that holds the database for minutes), each job its own
transaction; and pausing and resuming queues."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from django.db import IntegrityError, connections, transaction

from later_django import queues
from later_django.conf import conf
from later_django.dashboard import reads
from later_django.db import dialect_for
from later_django.db.rows import JobQuery
from later_django.enqueue import cancel
from later_django.ids import is_job_id
from later_django.partitions.api import force_fail_partition_head, partition_stats

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
        "retry": (
            "only a failed job can be retried: not a partition job, nor a continuation "
            "that failed because its parent did, which a retry of its parent revives"
        ),
        "cancel": "only a job that has not started can be cancelled",
        "run_now": "only a delayed or requeued job can be made due",
        "force_fail": "only a job that was its partition's head can be force-failed",
    }[action]


def apply(action: str, job_ids: list[str]) -> Result:
    result = Result(action)
    heads = _heads() if action == "force_fail" else None
    for job_id in job_ids:
        _apply_one(action, job_id, result, heads)
    return result


def apply_matching(action: str, query: JobQuery) -> Result:
    """``action`` on every job ``query``'s list holds, page by page, until
    the list ends or the time budget is spent."""
    result = Result(action)
    deadline = time.monotonic() + BULK_BUDGET_SECONDS
    query = replace(query, page_size=BULK_PAGE)
    heads = _heads() if action == "force_fail" else None
    while True:
        page = reads.job_page(query)
        for job in page.jobs:
            _apply_one(action, job.id, result, heads)
        if page.after is None:
            return result
        if time.monotonic() >= deadline:
            result.more = True
            return result
        query = replace(query, after=page.after)


def _heads() -> set[tuple[str, int, int]]:
    """(topic, partition, sequence) of every partition's head now. Force-fail
    acts on the jobs that were heads when the action started: failing a head
    makes the next job the head, which a list of them must not fail too."""
    return {
        (s.topic, s.partition, s.head_sequence)
        for s in partition_stats()
        if s.head_sequence is not None
    }


def _apply_one(
    action: str, job_id: str, result: Result, heads: set[tuple[str, int, int]] | None
) -> None:
    alias, namespace = conf.database, conf.namespace
    dialect = dialect_for(alias)
    if not is_job_id(job_id):
        changed = False
    elif action == "cancel":
        changed = cancel(job_id)
    elif action == "force_fail":
        changed = _force_fail(job_id, heads or set())
    else:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                if action == "run_now":
                    changed = dialect.control.run_now(cursor, namespace=namespace, job_id=job_id)
                else:
                    revived = dialect.control.retry_failed(
                        cursor, namespace=namespace, job_id=job_id
                    )
                    changed = revived is not None
                    result.revived += revived or 0
        except IntegrityError:
            # A unique job whose key another enqueue took as it ran: the
            # key is that job's, and this one is left as it was.
            changed = False
    if changed:
        result.done += 1
    else:
        result.skipped.append(job_id)


def _force_fail(job_id: str, heads: set[tuple[str, int, int]]) -> bool:
    job = reads.job_detail(job_id)
    if job is None or (job["topic"], job["partition"], job["sequence"]) not in heads:
        return False
    try:
        return force_fail_partition_head(job["topic"], job["partition"], job_id=job_id) is not None
    except ValueError:
        return False  # its topic is no longer configured


# -- queues ---------------------------------------------------------------------------
QUEUE_ACTIONS = {"pause": "paused", "resume": "resumed"}


@dataclass(frozen=True, slots=True)
class QueueResult:
    """What a pause or resume did: ``changed`` is False when the queue was
    already in that state (a page older than the last change, say).
    ``ignoring`` counts the live servers of a release before queues, which
    ignore pause."""

    action: str
    queue: str
    changed: bool
    ignoring: int = 0

    def message(self) -> str:
        if not self.changed:
            was = "already paused" if self.action == "pause" else "not paused"
            return f"Queue {self.queue} was {was}: nothing changed."
        if self.action == "resume":
            return f"Queue {self.queue} resumed: servers serving it start its jobs again."
        text = (
            f"Queue {self.queue} paused: no server starts its jobs until it is resumed "
            "(jobs running now finish)."
        )
        if self.ignoring:
            servers = "server" if self.ignoring == 1 else "servers"
            text += (
                f" {self.ignoring} live {servers} of a release before queues "
                "ignore the pause and still start its jobs."
            )
        return text


def apply_to_queue(action: str, name: str) -> QueueResult:
    """Pause or resume queue ``name`` on every server. ValueError when it is
    not a queue declared in LATER["QUEUES"] (queues.pause_queue's)."""
    if action == "pause":
        changed = queues.pause_queue(name)
        ignoring = len(reads.previous_release_servers()) if changed else 0
        return QueueResult(action, name, changed, ignoring)
    return QueueResult(action, name, queues.resume_queue(name))
