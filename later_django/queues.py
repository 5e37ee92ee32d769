"""Named queues: which exist, how a job's queue is stored, and pausing them.

A queue is declared in ``LATER["QUEUES"]``; "default" always exists. A job
stores its queue's name, or '' for the default queue: a plain insert never
names the column, whose database default that is. Each queue's jobs are
counted in a lane of their own (``lane_of``). Pausing is shared by every server through
``later_queue``: every claim of a queue reads its row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django.conf import conf
from later_django.states import Stage

DEFAULT_QUEUE: Final = "default"
# A Python identifier of at most 64 characters: it names a column value, a
# metrics label and a command-line option.
QUEUE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
PARTITION_LANE: Final = "partition"


def is_queue_name(name: object) -> bool:
    return isinstance(name, str) and QUEUE_NAME.fullmatch(name) is not None


def check_queue_name(name: object, argument: str = "queue") -> str:
    """``name`` if it can name a queue; TypeError or ValueError otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a str, got {type(name).__name__}")
    if QUEUE_NAME.fullmatch(name) is None:
        raise ValueError(
            f"{argument}={name!r} is not a queue name; use an identifier of at most 64 "
            "characters (letters, digits and '_'), declared in LATER['QUEUES']"
        )
    return name


def declared() -> tuple[str, ...]:
    """The queues of LATER["QUEUES"], "default" first (it always exists)."""
    names = [name for name in conf.QUEUES if name != DEFAULT_QUEUE]
    return (DEFAULT_QUEUE, *names)


def stored(name: str, argument: str = "queue") -> str | None:
    """What an insert of a job of queue ``name`` writes to its column: None
    for the default queue (the insert leaves the column to its database
    default, ''); ValueError naming the setting when ``name`` is not
    declared (TypeError when it is no str), so a typo never strands a job on
    a queue no server serves."""
    if name == DEFAULT_QUEUE:
        return None
    if name not in conf.QUEUES:
        check_queue_name(name, argument)
        raise ValueError(
            f"{argument}={name!r} is not declared in LATER['QUEUES'] (declared: "
            f"{', '.join(declared())}); add {name!r}: {{}} to it"
        )
    return name


def column_value(name: str | None) -> str:
    """What later_job.queue holds for the jobs of queue ``name``: '' for the
    default queue (the column's database default; a NewJob's None), else
    the name. An insert that writes the column for every row of a batch
    writes this, never NULL."""
    return "" if name is None or name == DEFAULT_QUEUE else name


def name_of(queue: str | None) -> str:
    """The queue a job's ``queue`` column ('' or a name; a NewJob's None)
    names."""
    return queue or DEFAULT_QUEUE


def lane_of(queue: str) -> str:
    """The counter lane of the jobs of ``queue`` (migration 0014)."""
    return "" if queue == DEFAULT_QUEUE else f"q:{queue}"


def queue_of_lane(lane: str) -> str | None:
    """The queue name a plain counter lane counts, None for a partition's."""
    if lane == "":
        return DEFAULT_QUEUE
    if lane.startswith("q:"):
        return lane[2:]
    return None


# The metrics' queue label of partition jobs: not a queue name, so no
# queue can take it.
PARTITION_LABEL: Final = ":partition"


def counts_by_queue(lane_counts: Iterable[Any]) -> dict[tuple[str, str], int]:
    """(queue, stage) -> jobs, from LaneCount rows; the default queue has
    every stage, so its series always exist."""
    counts = {(DEFAULT_QUEUE, stage.value): 0 for stage in Stage}
    for row in lane_counts:
        queue = queue_of_lane(row.lane) or PARTITION_LABEL
        counts[queue, row.stage] = counts.get((queue, row.stage), 0) + int(row.n)
    return counts


# -- pause and resume ---------------------------------------------------------------
def pause_queue(name: str) -> bool:
    """Pause queue ``name`` on every server; return whether it was running.

    Persisted: it stays paused across restarts until ``resume_queue``. Once
    this returns, no server starts a job of the queue (every claim reads the
    flag); jobs already running finish. ValueError when the queue is not
    declared in LATER["QUEUES"]."""
    return _set_paused(name, paused=True)


def resume_queue(name: str) -> bool:
    """Let queue ``name`` run again; return whether it was paused. Idle
    workers serving it are woken at once."""
    return _set_paused(name, paused=False)


def _set_paused(name: str, *, paused: bool) -> bool:
    from later_django import schema
    from later_django.db import dialect_for

    stored(name, "name")  # refuses an undeclared queue, naming the setting
    alias = conf.database
    dialect = dialect_for(alias)
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            changed = dialect.cluster.queue_set_paused(
                cursor, namespace=conf.namespace, name=name, paused=paused
            )
            if changed and not paused:
                dialect.announce_ready(cursor, namespace=conf.namespace, queue=name)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    return changed


def paused_queues() -> set[str]:
    """The queues of this namespace paused now."""
    from later_django.db import dialect_for

    alias = conf.database
    with connections[alias].cursor() as cursor:
        return dialect_for(alias).cluster.queue_paused(cursor, namespace=conf.namespace)


apause_queue = sync_to_async(pause_queue)
aresume_queue = sync_to_async(resume_queue)


def served(spec: str | None, workers: int) -> dict[str, int]:
    """The queues a server serves and their workers, from ``--queues``
    ("emails=4,default" : a queue without a count gets ``workers``); every
    declared queue with ``workers`` each when ``spec`` is None. ValueError
    naming the problem otherwise."""
    if spec is None:
        return dict.fromkeys(declared(), workers)
    result: dict[str, int] = {}
    for item in spec.split(","):
        name, _, count = item.strip().partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"--queues {spec!r} has an empty item; write e.g. emails=4,default=8")
        stored(name, "--queues")
        if name in result:
            raise ValueError(f"--queues names {name!r} twice")
        if not count:
            result[name] = workers
            continue
        if not count.strip().isdigit() or int(count) < 1:
            raise ValueError(
                f"--queues {name}={count!r}: a queue's workers must be a whole number >= 1"
            )
        result[name] = int(count)
    return result
