"""later's SQL text: one module per domain, and one per vendor for what only it runs.

Nothing here runs a statement or imports runtime code. Every statement is a
plain string template (never an f-string), written once. Templates share
text in one way only: compose() writes named parts into a template's
``{part}`` markers at import. What is left is filled in by
Statements.sql(): once per vendor, these markers

    {now}          the database's clock in epoch ms, one value for the whole
                   statement (an index search can use it as a bound)
    {stamp}        the time of a stage change (STAMP)
    {greatest}     the larger of two values (GREATEST, or SQLite's MAX)
    {skip_locked}  appended to SELECTs that pick rows to change, where the
                   vendor locks rows
    {share_lock}   appended to a read that must wait for a concurrent write
    {for_update}   appended to a read whose rows must stay as read until the
                   transaction ends, where the vendor locks rows

and, per call, the sizes of a batch: {ids} (one %s per id), {pairs} (one
(%s, %s) per pair), {values} (one row template per row), {limit} (a number
written into the text).

Every time written or compared is the database's, never a host's, so hosts
with skewed clocks agree on when a lease expires or a job is due, and a
stage's time is taken when its write runs, not before it waited for a lock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

# later's tables, as its migrations create them.
TABLES: Final = (
    "later_job",
    "later_stage_count",
    "later_server",
    "later_maintenance",
    "later_topic",
    "later_lease",
    "later_schedule",
    "later_task_result",
    "later_partition_seq",
    "later_partition",
    "later_log_topic",
    "later_log_partition",
    "later_log_record",
    "later_log_consumer",
    "later_dashboard_stat",
    "later_queue_sample",
    "later_queue",
    "later_fan_in",
)

# The time of a stage change: never before the row's previous change, so a
# job's history never goes backwards (two writers' clocks, or a writer that
# waited).
STAMP: Final = "{greatest}({now}, changed_ms)"


_MARKER = re.compile(r"{([a-z_]+)}")


def fill(template: str, parts: Mapping[str, str]) -> str:
    """``template`` with the ``{name}`` markers ``parts`` names written in;
    any other marker is left as it is."""
    return _MARKER.sub(lambda m: parts.get(m[1], m[0]), template)


def compose(template: str, **parts: str) -> str:
    """``template`` with each ``{name}`` of ``parts`` written in: how
    statements share text. Every part must have its marker (a misspelt one
    fails at import)."""
    missing = [name for name in parts if "{" + name + "}" not in template]
    if missing:
        raise ValueError(f"the template has no marker for {', '.join(missing)}")
    return fill(template, parts)


# A named parameter: %(name)s, as Django's cursors pass it to both vendors.
PARAMETER = re.compile(r"%\((\w+)\)s")


# Compared and hashed by identity: each is a module constant, or cached by
# the function that makes it, so a store finds its bound text at once.
@dataclass(frozen=True, slots=True, eq=False)
class Statement:
    """One SQL statement, written whole: its text with named parameters
    (``%(name)s``) and the vendor's words in braces (db/sql/__init__.py).

    ``lists`` names the parameters that take a sequence: each is written as
    one placeholder per item, or one row of placeholders per tuple item
    (``IN (%(ids)s)``, ``VALUES %(claims)s``). ``inline`` names the integer
    parameters written into the text (a LIMIT the planner must see)."""

    text: str
    lists: tuple[str, ...] = ()
    inline: tuple[str, ...] = ()
    # Every name a caller passes: the text's, lists and inline included.
    params: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", frozenset(PARAMETER.findall(self.text)))
        undeclared = set(self.lists + self.inline) - self.params
        if undeclared:
            raise ValueError(f"no %(name)s in the statement for {sorted(undeclared)}")
