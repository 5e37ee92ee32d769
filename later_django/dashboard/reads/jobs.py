"""The dashboard's job pages: the counts on the lists' tabs, a page of a
list (keyset-paginated), and one job without its payload.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from django.core.cache import cache

from later_django.conf import conf
from later_django.dashboard import cursors
from later_django.dashboard.reads.source import CACHE_SECONDS, dialect_cursor
from later_django.db.rows import JobPage, JobQuery, JobSummary
from later_django.states import Stage

CHILDREN_SHOWN = 25


def counts() -> dict[str, int]:
    """Jobs per stage, from the counters: what the job lists' tabs show,
    cached like the overview."""
    key = f"later:dashboard:counts:{conf.database}:{conf.namespace}"
    found = cache.get(key)
    if found is None:
        with dialect_cursor() as (dialect, cursor):
            found = dialect.reads.stage_counts(cursor, namespace=conf.namespace)
        cache.set(key, found, CACHE_SECONDS)
    return found  # type: ignore[no-any-return]


# -- jobs -----------------------------------------------------------------------------------
def job_page(query: JobQuery) -> JobPage:
    with dialect_cursor() as (dialect, cursor):
        return dialect.reads.job_page(cursor, query)


def job_detail(job_id: str) -> dict[str, Any] | None:
    """A job without its payload: times, durations, history, parent (every
    parent of a fan-in job) and up to 25 direct continuations."""
    with dialect_cursor() as (dialect, cursor):
        detail = dialect.reads.job_detail(cursor, namespace=conf.namespace, job_id=job_id)
        if detail is None:
            return None
        parents = []
        if detail.parent_id is not None:  # only a continuation can be a fan-in job
            parents = dialect.reads.job_parents(cursor, job_id=job_id)
        children = dialect.reads.job_children(cursor, job_id=job_id, limit=CHILDREN_SHOWN + 1)
        now_ms = dialect.clock_now(cursor)
    job = asdict(detail)
    history = parse_history(job.pop("history"))
    job["history"] = [{"stage": stage, "at_ms": at} for stage, at in history]
    job["durations_ms"] = durations(history, job["created_ms"], job["finished_ms"], now_ms)
    # A fan-in job's parents; the one it waits on (or waited on last) is its parent_id.
    job["parents"] = [
        {"id": p.id, "short_id": p.id[-6:], "job": None if p.job is None else summary_dict(p.job)}
        for p in parents
    ]
    job["children"] = [summary_dict(c) for c in children[:CHILDREN_SHOWN]]
    job["more_children"] = len(children) > CHILDREN_SHOWN
    job["now_ms"] = now_ms
    return job


def parse_history(text: str) -> list[tuple[str, int]]:
    changes = []
    for entry in text.split(";"):
        if entry:
            stage, _, at = entry.partition("@")
            changes.append((stage, int(at)))
    return changes


def durations(
    history: list[tuple[str, int]], created_ms: int, finished_ms: int | None, now_ms: int
) -> dict[str, int]:
    """Total time from creation to the finish (or now), split into the time
    spent running handlers (processing), the time it sat failed until an
    operator retried it (failed), and the rest, spent waiting to run: a
    retried job's wait starts at the retry, not at its failure."""
    end = finished_ms if finished_ms is not None else now_ms
    processing = failed = 0
    for (stage, at), following in zip(history, [*history[1:], None], strict=True):
        until = following[1] if following else end
        if stage == Stage.RUNNING:
            processing += until - at
        elif stage == Stage.FAILED:
            failed += until - at
    total = max(0, end - created_ms)
    processing = min(max(0, processing), total)
    failed = min(max(0, failed), total - processing)
    return {
        "total": total,
        "processing": processing,
        "failed": failed,
        "waiting": total - processing - failed,
    }


SUMMARY_FIELDS = tuple(field.name for field in fields(JobSummary))


def summary_dict(job: JobSummary) -> dict[str, Any]:
    """``job`` as JSON: its fields (plain values: no deep copy needed) and
    the last 6 characters of its id, which lists show."""
    out = {name: getattr(job, name) for name in SUMMARY_FIELDS}
    out["short_id"] = job.id[-6:]
    return out


def page_dict(page: JobPage) -> dict[str, Any]:
    return {
        "jobs": [summary_dict(j) for j in page.jobs],
        "next": cursors.encode(page.after),
        "scanned_out": page.scanned_out,
    }
