"""The job list's filter, read from a request's query string: the same
names in the page's URL, its JSON and its "all matching" action, so a view
can be bookmarked and scripted. Bad values raise ValueError naming the fix."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

from later_django.conf import conf
from later_django.dashboard import cursors
from later_django.db.rows import JobQuery
from later_django.db.rows.dashboard import RECENT
from later_django.ids import ID_ALPHABET, ULID_LENGTH
from later_django.queue_names import is_queue_name
from later_django.states import Stage

STAGES = [stage.value for stage in Stage]
# The lists the stage menu offers, in its order: every job newest first,
# then one list per stage.
LISTS = [RECENT, *STAGES]


def query_from(params: Mapping[str, str], *, with_cursor: bool = True) -> JobQuery:
    stage = params.get("stage") or None
    prefix = (params.get("q") or "").strip().lower() or None
    topic = params.get("topic") or None
    if stage is None and prefix is None and topic is None:
        # No filter: every job, newest first. (A topic without a stage: its
        # unfinished jobs; an id search: its jobs of every stage.)
        stage = RECENT
    if stage is not None and stage not in LISTS:
        raise ValueError(f"unknown stage {stage!r}: use one of {', '.join(LISTS)}")
    if prefix is not None and (len(prefix) > ULID_LENGTH or not set(prefix) <= ID_ALPHABET):
        raise ValueError(
            f"{prefix!r} is not the start of a job id: ids are up to 26 characters of "
            "0-9 and a-z without i, l, o and u"
        )
    partition = params.get("partition") or None
    if partition is not None and not partition.isdigit():
        raise ValueError(f"partition must be a number, got {partition!r}")
    if partition is not None and topic is None:
        raise ValueError("a partition filter needs a topic: set topic too")
    queue = params.get("queue") or None
    if queue is not None:
        if not is_queue_name(queue):
            raise ValueError(f"{queue!r} is not a queue name")
        if stage != "enqueued":
            raise ValueError("the queue filter picks a queue's ready jobs: set stage=enqueued")
    after = params.get("after") if with_cursor else None
    return JobQuery(
        namespace=conf.namespace,
        stage=stage,
        type_name=params.get("type") or None,
        topic=topic,
        partition=None if partition is None else int(partition),
        id_prefix=prefix,
        queue=queue,
        after=cursors.decode(after) if after else None,
    )


def fields_of(query: JobQuery) -> list[tuple[str, str]]:
    """The filter fields that select ``query``'s jobs (no cursor)."""
    values = {
        "stage": query.stage,
        "type": query.type_name,
        "topic": query.topic,
        "partition": None if query.partition is None else str(query.partition),
        "q": query.id_prefix,
        "queue": query.queue,
    }
    return [(k, v) for k, v in values.items() if v]


def query_string(query: JobQuery, **changes: str | None) -> str:
    """The query string that shows ``query`` (with ``changes``)."""
    values: dict[str, str | None] = {**dict(fields_of(query)), **changes}
    return urlencode({k: v for k, v in values.items() if v})
