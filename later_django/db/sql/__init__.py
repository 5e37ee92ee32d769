"""later's SQL: one module of whole statements per concern, and one per
vendor for its words. Nothing here runs a statement or imports runtime code.

Each statement is a ``Statement``: its whole text, with named parameters
(``%(job_id)s``). The braces left in a text are the vendor's words, written
in once per vendor by db/statements.py's ``Statements``:

    {now}          the database's clock in epoch ms, one value for the whole
                   statement (an index search can use it as a bound)
    {greatest}     the larger of two values (GREATEST, or SQLite's MAX)
    {skip_locked}  appended to SELECTs that pick rows to change, where the
                   vendor locks rows
    {share_lock}   appended to a read that must wait for a concurrent write
    {for_update}   appended to a read whose rows must stay as read until the
                   transaction ends, where the vendor locks rows

A stage change stamps ``{greatest}({now}, changed_ms)``: never before the
row's previous change, so a job's history never goes backwards (two
writers' clocks, or a writer that waited). Every time written or compared
is the database's, never a host's, so hosts with skewed clocks agree on
when a lease expires or a job is due, and a stage's time is taken when its
write runs, not before it waited for a lock.

Texts are joined from parts (``compose``) in two places only, each saying
why: the inserts of jobs that set options (enqueue.py) and the dashboard's
job list (dashboard.py, db/reads.py).
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

_MARKER = re.compile(r"{([a-z_]+)}")


def fill(template: str, parts: Mapping[str, str]) -> str:
    """``template`` with the ``{name}`` markers ``parts`` names written in;
    any other marker is left as it is."""
    return _MARKER.sub(lambda m: parts.get(m[1], m[0]), template)


def compose(template: str, **parts: str) -> str:
    """``template`` with each ``{name}`` of ``parts`` written in. Every part
    must have its marker (a misspelt one fails at import)."""
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
