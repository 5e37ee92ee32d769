"""Queue names: what can name a queue, and how a job's queue is stored and counted.

A job stores its queue's name, or '' for the default queue (the column's
database default, so a plain insert never names it); each queue is counted
in a lane of its own. Pure, so db/ imports it; queues.py reads the settings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

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
