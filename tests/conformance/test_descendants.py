"""The walks of a job's descendants that every store finishing a job shares
(db/descendants.py): failing them with any parent, and an operator's retry
making them wait again.
"""

from __future__ import annotations

import pytest

from later_django.db.descendants import fail_descendants
from later_django.db.statements import Statements
from later_django.states import PARENT_FAILED
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    NS,
    assert_counts,
    cursor_of,
    finish_unseen,
    insert,
    insert_child,
    insert_fan_in,
    job_row,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def test_fail_descendants_fails_every_waiting_generation_and_nothing_else(later_db, dialect):
    """The waiting continuations of a job, and theirs, fail as "parent
    failed"; the job itself and another job's continuation do not change."""
    parent = insert(later_db)
    child, _ = insert_child(later_db, parent)
    grandchild, _ = insert_child(later_db, child)
    other = insert(later_db)
    other_child, _ = insert_child(later_db, other)
    with cursor_of(later_db, atomic=True) as c:
        fail_descendants(Statements(dialect.vendor_sql), c, job_id=parent, retention_ms=DAY_MS)
    assert stages(later_db, parent, child, grandchild, other_child) == [
        "enqueued",
        "failed",
        "failed",
        "waiting",
    ]
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert_counts(later_db)


def test_fan_in_children_fail_with_any_parent_and_revive_with_it(later_db, dialect):
    """A failing job fails its fan-in children whichever parent they wait
    on, and theirs; an operator's retry of it makes them wait on it again."""
    x, y = insert(later_db, delay_ms=HOUR_MS), insert(later_db)
    z = insert(later_db, delay_ms=DAY_MS)
    child = insert_fan_in(later_db, [x, y])[0]
    grandchild = insert_fan_in(later_db, [z, child])[0]
    assert [job_row(later_db, j)["parent_id"] for j in (child, grandchild)] == [x, z], (
        "each waits on its parent due last"
    )
    plain = insert_child(later_db, child)[0]
    with cursor_of(later_db, atomic=True) as c:
        fail_descendants(Statements(dialect.vendor_sql), c, job_id=y, retention_ms=DAY_MS)
    assert stages(later_db, x, y, z, child, grandchild, plain) == [
        "delayed",
        "enqueued",
        "delayed",
        "failed",
        "failed",
        "failed",
    ]
    finish_unseen(later_db, "failed", y)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.control.retry_failed(c, namespace=NS, job_id=y) == 3
    assert stages(later_db, y, child, grandchild, plain) == ["enqueued"] + ["waiting"] * 3
    assert [job_row(later_db, j)["parent_id"] for j in (child, grandchild, plain)] == [
        y,
        child,
        child,
    ]
    assert_counts(later_db)
