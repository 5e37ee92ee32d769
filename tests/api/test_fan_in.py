"""Fan-in (docs/how-to/fan-in.md): a job enqueued after several parents runs once,
after the last of them succeeded, and fails with "parent failed" without
running when one fails or is cancelled. On SQLite and PostgreSQL, through
the storage operations in this process and with real later_worker
processes."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import threading
import time
from collections import Counter

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db import connections, transaction
from django.test import Client

import later_django as later
from later_django import JobContext
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, FailureWrite, OwnerFence, SuccessBatch
from later_django.db.sessions import WorkerSessions
from later_django.ids import new_job_id
from later_django.testing import drain
from tests.helpers import history_stages, job_stages, read_records, set_later, wait_until
from tests.jobapp.jobs import FanOut, Noop, NoRetry, Ordered, Sleep, Until

DAY_MS = 86_400_000
OWNER = "worker-1"


class Rollback(Exception):
    """Raised inside an atomic block to roll it back."""


# -- helpers: the storage operations, as a worker runs them ----------------------------
def _claim_all(later_db, *, owner=OWNER):
    """Claim every ready job; return them by id."""
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        claimed = dialect_for(later_db.alias).hot.claim(
            c, ClaimRequest(namespace=conf.namespace, owner=owner, limit=100, lease_ms=30_000)
        )
    return {job.id: job for job in claimed}


def _complete(later_db, *claimed, owner=OWNER):
    """Store the success of ``claimed`` in one batch; return how many
    continuations it released."""
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        completion = dialect_for(later_db.alias).hot.complete_many(
            c,
            SuccessBatch(
                owner=owner, jobs=[(j.id, j.attempts) for j in claimed], retention_ms=DAY_MS
            ),
        )
    assert sorted(completion.done_ids) == sorted(j.id for j in claimed)
    return completion.released


def _fail(later_db, claimed, *, owner=OWNER):
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        assert dialect_for(later_db.alias).hot.fail(
            c,
            OwnerFence(job_id=claimed.id, attempts=claimed.attempts, owner=owner),
            FailureWrite(error="handler exploded", retention_ms=DAY_MS),
        )


def _sweep(later_db):
    """One run of the orphan sweep (the resolve_orphans maintenance step)."""
    upkeep = dialect_for(later_db.alias).upkeep
    with connections[later_db.alias].cursor() as c:
        orphans = upkeep.orphans(c, namespace=conf.namespace, limit=100)
        for orphan in orphans:
            with transaction.atomic(using=later_db.alias):
                upkeep.resolve_orphan(c, orphan, retention_ms=DAY_MS)
    return orphans


def _parent_rows(later_db, child=None):
    if child is None:
        return later_db.rows("SELECT child_id, parent_id FROM later_fan_in ORDER BY 1, 2")
    return [
        row[0]
        for row in later_db.rows(
            "SELECT parent_id FROM later_fan_in WHERE child_id = %s ORDER BY 1", [child]
        )
    ]


def _waits_on(later_db, child):
    return str(later_db.job_field(child, "parent_id"))


def _counts():
    return {stage: n for stage, n in later.stage_counts().items() if n}


# -- 1. waiting for every parent -----------------------------------------------------------
def test_fan_in_child_waits_for_every_parent_and_the_last_releases_it(later_db):
    """Completed one at a time, in any order, the parents release the child
    only with the last: until then it waits on a parent that has not
    finished. get_job lists every parent."""
    parents = [later.enqueue(Noop(n=n)) for n in range(5)]
    child = later.enqueue(Noop(n=99), after=parents)
    info = later.get_job(child)
    assert info.stage == "waiting"
    assert info.parents == tuple(sorted(parents))
    assert info.parent_id in parents
    assert _parent_rows(later_db, child) == sorted(parents)

    claimed = _claim_all(later_db)
    assert set(claimed) == set(parents), "the child is not claimable while it waits"
    order = list(parents)
    random.Random(7).shuffle(order)
    for done, parent in enumerate(order, start=1):
        released = _complete(later_db, claimed[parent])
        if done < len(order):
            assert released == 0
            assert later_db.stage_of(child) == "waiting"
            assert later_db.stage_of(_waits_on(later_db, child)) == "running", (
                "it waits on a parent that has not finished"
            )
        else:
            assert released == 1
    assert job_stages(later.get_job(child)) == ["waiting", "enqueued"]
    assert _counts() == {"success": 5, "enqueued": 1}


def test_fan_in_child_of_parents_done_in_one_batch_is_released_once(later_db):
    """Parents completed by one batch release their child once."""
    parents = [later.enqueue(Noop(n=n)) for n in range(3)]
    child = later.enqueue(Noop(n=99), after=parents)
    claimed = _claim_all(later_db)
    assert _complete(later_db, *claimed.values()) == 1
    assert job_stages(later.get_job(child)) == ["waiting", "enqueued"]


@pytest.mark.parametrize("which", ["the one it waits on", "another"])
def test_fan_in_failing_parent_fails_the_child_and_its_descendants(later_db, which):
    """A parent failing fails the fan-in child with "parent failed", whichever
    parent it waits on, with its own continuations: of one parent, and
    fan-in children of it that wait on another."""
    parents = [later.enqueue(Noop(n=n)) for n in range(3)]
    child = later.enqueue(Noop(n=99), after=parents)
    grandchild = later.enqueue_continue(child, Noop(n=100))
    bystander = later.enqueue_delayed(Noop(n=101), dt.timedelta(hours=1))
    # A fan-in grandchild first waits on the bystander, not on the child.
    fan_in_grandchild = later.enqueue(Noop(n=102), after=[bystander, child])
    assert _waits_on(later_db, fan_in_grandchild) == bystander
    claimed = _claim_all(later_db)
    waited_on = _waits_on(later_db, child)
    failing = waited_on if which == "the one it waits on" else min(set(parents) - {waited_on})
    _fail(later_db, claimed[failing])
    for job_id in (child, grandchild, fan_in_grandchild):
        info = later.get_job(job_id)
        assert (info.stage, info.last_error) == ("failed", "parent failed"), job_id
    others = set(parents) - {failing}
    assert {later_db.stage_of(p) for p in others} == {"running"}
    assert later_db.stage_of(bystander) == "delayed"
    # The other parents' success changes nothing: the child failed for good.
    assert _complete(later_db, *(claimed[p] for p in others)) == 0
    assert later_db.stage_of(child) == "failed"
    assert _counts() == {"success": 2, "failed": 4, "delayed": 1}


def test_fan_in_cancelled_parent_fails_the_child(later_db):
    """Cancelling a parent that has not started fails the child."""
    running = later.enqueue(Noop(n=1))
    delayed = later.enqueue_delayed(Noop(n=2), dt.timedelta(hours=1))
    child = later.enqueue(Noop(n=99), after=[running, delayed])
    assert later.cancel(delayed)
    info = later.get_job(child)
    assert (info.stage, info.last_error) == ("failed", "parent failed")


@pytest.mark.parametrize(
    ("finished", "stage", "error"),
    [
        (("success", "success"), "enqueued", None),
        (("success", "failed"), "failed", "parent failed"),
        (("success", "cancelled"), "failed", "parent failed"),
        (("success", "running"), "waiting", None),
    ],
)
def test_fan_in_of_parents_already_finished(later_db, finished, stage, error):
    """Parents that all succeeded: ready at once; one failed or cancelled:
    stored failed at once, with its finish and expiry; one unfinished: it
    waits on that one."""
    parents = [later.enqueue(Noop(n=n), priority=10 - n) for n in range(2)]
    claimed = _claim_all(later_db)
    for parent, outcome in zip(parents, finished, strict=True):
        if outcome == "success":
            _complete(later_db, claimed[parent])
        elif outcome == "failed":
            _fail(later_db, claimed[parent])
        elif outcome == "cancelled":
            later_db.execute(
                "UPDATE later_job SET stage = 'cancelled', lease_owner = NULL, "
                "lease_expires_ms = NULL WHERE id = %s",
                [parent],
            )
    child = later.enqueue(Noop(n=99), after=parents)
    info = later.get_job(child)
    assert (info.stage, info.last_error) == (stage, error)
    assert (info.finished_at is not None) == (stage == "failed")
    assert (info.expires_at is not None) == (stage == "failed")
    if stage == "waiting":
        assert info.parent_id == parents[1]


# -- 2. what an enqueue refuses, and what it writes -----------------------------------------
def test_fan_in_unknown_parent_raises_job_not_found_and_writes_nothing(later_db):
    """A parent that does not exist (or is another namespace's) refuses the
    whole job, naming it; nothing is written, and the caller's block goes
    on."""
    known = later.enqueue(Noop(n=1))
    missing = new_job_id()
    with pytest.raises(later.JobNotFound, match=f"parent job {missing} does not exist"):
        later.enqueue(Noop(n=2), after=[known, missing])
    assert later_db.job_count() == 1
    assert _parent_rows(later_db) == []
    gone = sorted([new_job_id(), new_job_id()])
    with transaction.atomic(using=later_db.alias):
        with pytest.raises(later.JobNotFound, match=f"parent jobs {gone[0]}, {gone[1]} do not"):
            later.enqueue_continue_all([gone[1], known, gone[0]], Noop(n=3))
        kept = later.enqueue(Noop(n=4))
    assert later_db.job_count() == 2 and later_db.stage_of(kept) == "enqueued"
    assert _parent_rows(later_db) == []
    assert _counts() == {"enqueued": 2}


def test_fan_in_rolled_back_with_the_callers_transaction_leaves_nothing(later_db):
    """A fan-in job commits or rolls back with the caller's writes: its row
    and its parent list alike."""
    parents = [later.enqueue(Noop(n=n)) for n in range(2)]
    with pytest.raises(Rollback), transaction.atomic(using=later_db.alias):
        later.enqueue(Noop(n=99), after=parents)
        assert len(_parent_rows(later_db)) == 2
        raise Rollback
    assert later_db.job_count() == 2
    assert _parent_rows(later_db) == []
    assert _counts() == {"enqueued": 2}


def test_fan_in_arguments_are_checked_before_anything_is_written(later_db):
    """An empty list, a malformed id, a value that is no list of ids, or a
    time with ``after`` are refused, naming the argument; duplicates count
    once; one parent is a plain continuation."""
    parent = later.enqueue(Noop(n=1))
    other = later.enqueue(Noop(n=2))
    with pytest.raises(ValueError, match=r"after=\[\] names no parent job"):
        later.enqueue(Noop(), after=[])
    with pytest.raises(ValueError, match=r"parents=\[\] names no parent job"):
        later.enqueue_continue_all([], Noop())
    with pytest.raises(ValueError, match=r"after\[1\]='nope' is not a job id"):
        later.enqueue(Noop(), after=[parent, "nope"])
    with pytest.raises(TypeError, match=r"after\[0\] must be a job id string, got int"):
        later.enqueue(Noop(), after=[7])
    with pytest.raises(TypeError, match="after must be a job id or a list of job ids, got int"):
        later.enqueue(Noop(), after=7)
    with pytest.raises(TypeError, match="after and delay both say when the job runs"):
        later.enqueue(Noop(), after=[parent, other], delay=dt.timedelta(seconds=1))
    with pytest.raises(TypeError, match=r"parents must be a list of job ids, got a str"):
        later.enqueue_continue_all(parent, Noop())
    with pytest.raises(TypeError, match=r"several parents use enqueue_continue_all"):
        later.enqueue_continue([parent, other], Noop())
    assert later_db.job_count() == 2 and _parent_rows(later_db) == []

    twice = later.enqueue(Noop(n=3), after=[parent, other.upper(), parent, other])
    assert _parent_rows(later_db, twice) == sorted([parent, other])
    one = later.enqueue(Noop(n=4), after=[parent, parent])
    assert _parent_rows(later_db, one) == [], "one parent: a plain continuation"
    info = later.get_job(one)
    assert (info.parent_id, info.parents) == (parent, (parent,))
    assert later.get_job(parent).parents == ()


def test_fan_in_enqueue_many_job_context_and_async_twin(later_db):
    """enqueue_many(after=[...]) makes each job a fan-in child; JobContext and
    the async twin take the same path."""
    parents = [later.enqueue(Noop(n=n)) for n in range(2)]
    many = later.enqueue_many([Noop(n=10), Noop(n=11)], after=parents)
    from_context = JobContext(job_id=parents[0], attempt=1).enqueue_continue_all(
        parents, Noop(n=12)
    )

    async def enqueue_async() -> str:
        try:
            return await later.aenqueue_continue_all(parents, Noop(n=13), priority=5)
        finally:
            # It ran on asgiref's worker thread: close its connections.
            await sync_to_async(connections.close_all)()

    from_async = asyncio.run(enqueue_async())
    for child in [*many, from_context, from_async]:
        assert later.get_job(child).stage == "waiting"
        assert _parent_rows(later_db, child) == sorted(parents)
    assert later.get_job(from_async).priority == 5
    claimed = _claim_all(later_db)
    assert _complete(later_db, *claimed.values()) == 4


# -- 3. what the other paths do with a fan-in child ------------------------------------
def test_fan_in_sweep_resolves_a_child_whose_parent_finished_unseen(later_db):
    """A parent whose finish did not see the child (it committed while the
    child was being pointed at it) leaves it to the orphan sweep, which makes
    it wait on a parent that has not finished, never releases it early, and
    releases it once all succeeded. A parent failed unseen fails it."""
    parents = [later.enqueue(Noop(n=n)) for n in range(3)]
    child = later.enqueue(Noop(n=99), after=parents)
    doomed = later.enqueue(Noop(n=98), after=parents)
    assert _sweep(later_db) == []
    finish = "UPDATE later_job SET stage = %s WHERE id = %s"
    first = _waits_on(later_db, child)
    later_db.execute(finish, ["success", first])
    assert {o.job_id for o in _sweep(later_db)} == {child, doomed}
    assert later_db.stage_of(child) == "waiting"
    second = _waits_on(later_db, child)
    assert second != first and later_db.stage_of(second) == "enqueued"
    assert _sweep(later_db) == [], "a child waiting on an unfinished parent is no orphan"
    for parent in set(parents) - {first}:
        later_db.execute(finish, ["success", parent])
    later_db.execute("UPDATE later_job SET stage = 'waiting' WHERE id = %s", [doomed])
    assert {o.job_id for o in _sweep(later_db)} == {child, doomed}
    assert job_stages(later.get_job(child)) == ["waiting", "enqueued"]

    again = later.enqueue(Noop(n=97), after=[later.enqueue(Noop(n=5)), parents[0]])
    assert later.get_job(again).stage == "waiting"
    other = [p for p in _parent_rows(later_db, again) if p != _waits_on(later_db, again)]
    later_db.execute(finish, ["failed", other[0]])
    _sweep(later_db)
    info = later.get_job(again)
    assert (info.stage, info.last_error) == ("failed", "parent failed")


def test_fan_in_settles_when_its_parents_finish_during_its_transaction(later_db):
    """Two parents that finish while the caller's transaction adding their
    fan-in child is open (two batches, neither waiting for that transaction)
    cannot see the child: once it commits, it is released, with no sweep."""
    if dialect_for(later_db.alias).single_writer:
        pytest.skip("one writer at a time: the finishes wait for the transaction")
    parents = [later.enqueue(Noop(n=n)) for n in range(2)]
    added, commit = threading.Event(), threading.Event()
    child: list[str] = []

    def caller() -> None:
        try:
            with transaction.atomic(using=later_db.alias):
                child.append(later.enqueue(Noop(n=99), after=parents))
                added.set()
                commit.wait(10)
        finally:
            connections.close_all()

    async def finish_parents() -> None:
        session = WorkerSessions(later_db.alias, prepare=True)
        try:
            claimed = await session.claim(
                ClaimRequest(namespace="default", owner="w", limit=2, lease_ms=30_000)
            )
            assert sorted(job.id for job in claimed) == sorted(parents)
            thread.start()
            await asyncio.to_thread(added.wait, 10)
            for job in claimed:  # each fails the test if it waits for the caller
                completion = await asyncio.wait_for(
                    session.complete_many(owner="w", jobs=[(job.id, 1)], retention_ms=DAY_MS), 3
                )
                assert completion.done_ids == [job.id] and completion.released == 0
        finally:
            await session.close()

    thread = threading.Thread(target=caller)
    asyncio.run(finish_parents())
    commit.set()
    thread.join(10)
    wait_until(
        lambda: later_db.stage_of(child[0]) == "enqueued",
        3,
        lambda: f"child enqueued, is {later_db.stage_of(child[0])}",
    )


def test_fan_in_retry_of_a_failed_parent_revives_the_child(later_db):
    """An operator's retry of the failed parent makes the fan-in child wait
    on it again; once it and the others succeed, the child is ready."""
    parents = [later.enqueue(Noop(n=n)) for n in range(2)]
    child = later.enqueue(Noop(n=99), after=parents)
    claimed = _claim_all(later_db)
    _complete(later_db, claimed[parents[0]])
    _fail(later_db, claimed[parents[1]])
    assert later_db.stage_of(child) == "failed"
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        revived = dialect_for(later_db.alias).control.retry_failed(
            c, namespace="default", job_id=parents[1]
        )
    assert revived == 1
    assert (later_db.stage_of(child), _waits_on(later_db, child)) == ("waiting", parents[1])
    _complete(later_db, _claim_all(later_db)[parents[1]])
    assert job_stages(later.get_job(child)) == ["waiting", "failed", "waiting", "enqueued"]


def test_fan_in_parent_pruned_after_it_succeeded_counts_as_succeeded(later_db):
    """A parent pruned after its success while the child waits on another
    does not hold the child back; pruning the child deletes its list."""
    parents = [later.enqueue(Noop(n=n)) for n in range(2)]
    child = later.enqueue(Noop(n=99), after=parents)
    claimed = _claim_all(later_db)
    early = next(p for p in parents if p != _waits_on(later_db, child))
    _complete(later_db, claimed[early])
    prune = dialect_for(later_db.alias).upkeep.prune
    expire = "UPDATE later_job SET expires_ms = 0 WHERE id = %s"
    later_db.execute(expire, [early])
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        assert prune(c, namespace="default", limit=10) == 1
    assert later.get_job(child).parents == tuple(sorted(parents)), "the list is kept"
    late = _waits_on(later_db, child)
    assert _complete(later_db, claimed[late]) == 1
    assert later_db.stage_of(child) == "enqueued"
    later_db.execute(
        "UPDATE later_job SET stage = 'success', expires_ms = 0 WHERE id = %s", [child]
    )
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        assert prune(c, namespace="default", limit=10) == 1
    assert _parent_rows(later_db) == []


def test_fan_in_drain_runs_the_child_once_after_its_parents(later_db):
    """later_django.testing.drain() runs a fan-in job after its parents, and
    one a handler fans in through its JobContext."""
    parents = [later.enqueue(Noop(n=n)) for n in range(3)]
    child = later.enqueue(Noop(n=99), after=parents)
    fan_out = later.enqueue(FanOut(width=3))
    runs = [run.job_id for run in drain()]
    assert Counter(runs)[child] == 1
    assert runs.index(child) > max(runs.index(p) for p in parents)
    (fanned,) = {c for c, _ in _parent_rows(later_db)} - {child}
    assert runs[-1] == fanned and runs.index(fan_out) < len(runs) - 4
    assert _counts() == {"success": 9}


def test_fan_in_partition_job_waits_for_every_parent(later_db, settings):
    """A partition job after several parents holds its partition's head until
    they all succeeded; an unknown parent takes no sequence."""
    set_later(settings, TOPICS={"ordered": 4})
    parents = [later.enqueue(Noop(n=n)) for n in range(2)]
    with pytest.raises(later.JobNotFound, match="does not exist"):
        later.enqueue_to_partition(Ordered("k", 0), after=[parents[0], new_job_id()])
    head = later.enqueue_to_partition(Ordered("k", 0), after=parents)
    info = later.get_job(head)
    assert (info.stage, info.sequence, info.parents) == ("waiting", 0, tuple(sorted(parents)))
    claimed = _claim_all(later_db)
    assert _complete(later_db, *claimed.values()) == 1
    assert later_db.stage_of(head) == "enqueued"


def test_plain_jobs_never_touch_the_fan_in_table(later_db):
    """With the fan-in table locked by another transaction, plain jobs are
    enqueued, claimed and completed as ever: nothing on their path names it
    (PostgreSQL plans a statement only with a lock on every table it names)."""
    if dialect_for(later_db.alias).single_writer:
        pytest.skip("one writer at a time: a table has no lock of its own")
    locked, release = threading.Event(), threading.Event()

    def hold_the_table() -> None:
        try:
            with (
                transaction.atomic(using=later_db.alias),
                connections[later_db.alias].cursor() as c,
            ):
                c.execute("LOCK TABLE later_fan_in IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(20)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert locked.wait(10)

        async def plain_path() -> None:
            session = WorkerSessions(later_db.alias, prepare=True)
            try:
                ids = await later.aenqueue_many([Noop(n=n) for n in range(3)])
                ids.append(await later.aenqueue(Noop(n=3)))
                claimed = await session.claim(
                    ClaimRequest(namespace="default", owner="w", limit=10, lease_ms=30_000)
                )
                assert sorted(job.id for job in claimed) == sorted(ids)
                done = await session.complete_many(
                    owner="w", jobs=[(j.id, j.attempts) for j in claimed], retention_ms=DAY_MS
                )
                assert sorted(done.done_ids) == sorted(ids)
            finally:
                await session.close()
                await sync_to_async(connections.close_all)()

        asyncio.run(asyncio.wait_for(plain_path(), 5))
    finally:
        release.set()
        holder.join(10)
    assert _counts() == {"success": 4}


# -- 4. the dashboard --------------------------------------------------------------------
def test_fan_in_job_page_shows_every_parent_and_each_parent_its_child(later_db):
    """A fan-in job's page lists every parent with its stage, a pruned one
    as deleted, and says which it waits on; each parent's page lists the
    child among its continuations, whichever parent it waits on."""
    cache.clear()
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="later_django", codename="view_dashboard")
    )
    viewer = Client()
    viewer.force_login(user)
    parents = [later.enqueue(Noop(n=n)) for n in range(3)]
    child = later.enqueue(Noop(n=99), after=parents)
    pruned = next(p for p in parents if p != _waits_on(later_db, child))
    later_db.execute("DELETE FROM later_job WHERE id = %s", [pruned])

    page = viewer.get(f"/admin/later/jobs/{child}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "runs once all 3 succeeded" in text
    for parent in parents:
        assert f'data-job-id="{parent}"' in text
    assert "deleted after it finished" in text
    waits_on = _waits_on(later_db, child)
    assert f'id="later-parent" href="/admin/later/jobs/{waits_on}/"' in text
    detail = viewer.get(f"/admin/later/api/jobs/{child}").json()
    assert [p["id"] for p in detail["parents"]] == sorted(parents)
    assert [p["job"] is None for p in detail["parents"]] == [p == pruned for p in sorted(parents)]
    for parent in set(parents) - {pruned}:
        children = viewer.get(f"/admin/later/api/jobs/{parent}").json()["children"]
        assert [c["id"] for c in children] == [child]


# -- 5. real worker processes ------------------------------------------------------------
# later_worker processes: Django's version changes nothing here (tox.ini).
FAST_MAINTENANCE = {"MAINTENANCE_INTERVAL": 0.2}


@pytest.mark.one_env
def test_fan_in_child_of_five_parents_runs_once_after_the_last(later_db, workers):
    """Two worker processes run five parents of different lengths; their
    fan-in child runs exactly once, after the last of them ended."""
    procs = [workers.start(timings=FAST_MAINTENANCE, workers=4) for _ in range(2)]
    workers.wait_registered(*procs)
    parents = [later.enqueue(Sleep(seconds=0.2 * n, n=n)) for n in range(1, 6)]
    child = later.enqueue(Noop(n=99), after=parents)
    workers.wait_stage(child, "success", 30)

    ends = {r.job_id: r.start for r in read_records(workers.record, "sleep-end")}
    assert set(ends) == set(parents)
    runs = read_records(workers.record, "noop", child)
    assert len(runs) == 1, runs
    assert runs[0].start >= max(ends.values()), "it ran after the last parent ended"
    assert job_stages(later.get_job(child)) == ["waiting", "enqueued", "running", "success"]
    assert _counts() == {"success": 6}
    for proc in procs:
        assert proc.stop() == 0, proc.output()


@pytest.mark.one_env
@pytest.mark.parametrize("failing", ["first", "last"])
def test_fan_in_child_of_a_failed_parent_fails_and_never_runs(later_db, workers, failing):
    """One parent failing (before the others end, or after they all
    succeeded) fails the fan-in child with "parent failed": it never runs."""
    proc = workers.start(timings=FAST_MAINTENANCE, workers=6)
    workers.wait_registered(proc)
    if failing == "first":
        # The failure comes while the others still run: it reaches the child
        # whichever parent that waits on.
        parents = [later.enqueue(Sleep(seconds=1.5, n=n)) for n in range(4)]
        parents.append(later.enqueue(NoRetry()))
    else:
        parents = [later.enqueue(Noop(n=n)) for n in range(4)]
        parents.append(later.enqueue(NoRetry(), delay=dt.timedelta(seconds=1)))
    child = later.enqueue(Noop(n=99), after=parents)
    workers.wait_stage(child, "failed", 30)
    for parent in parents[:4]:
        workers.wait_stage(parent, "success", 30)
    info = later.get_job(child)
    assert info.last_error == "parent failed"
    assert later_db.stage_of(parents[4]) == "failed"
    if failing == "first":
        assert info.finished_at < min(later.get_job(p).finished_at for p in parents[:4])
    assert read_records(workers.record, "noop", child) == [], "the child never ran"
    assert job_stages(info) == ["waiting", "failed"]
    assert proc.stop() == 0, proc.output()


ROUNDS = 4
FAN_INS = 4  # per round, of two parents each


@pytest.mark.one_env
def test_fan_in_parents_finishing_at_once_on_two_servers_release_each_child_once(later_db, workers):
    """Parents that end at the same moment on two servers each see the other
    still running: one of the finishes or the orphan sweep releases each
    fan-in child, exactly once, after both parents ended."""
    procs = [workers.start(timings=FAST_MAINTENANCE, workers=FAN_INS) for _ in range(2)]
    workers.wait_registered(*procs)
    children: dict[str, list[str]] = {}
    for _ in range(ROUNDS):
        at = time.time() + 1.0
        for n in range(FAN_INS):
            parents = [later.enqueue(Until(at=at, n=n)) for _ in range(2)]
            children[later.enqueue(Noop(n=n), after=parents)] = parents
        for child in children:
            workers.wait_stage(child, "success", 30)

    ended = {r.job_id: r for r in read_records(workers.record, "until")}
    assert len({ended[p].pid for ps in children.values() for p in ps}) == 2, "both served"
    runs = Counter(r.job_id for r in read_records(workers.record, "noop"))
    assert runs == dict.fromkeys(children, 1), "each child ran exactly once"
    for child, parents in children.items():
        (run,) = read_records(workers.record, "noop", child)
        assert run.start >= max(ended[p].start for p in parents)
        assert history_stages(str(later_db.job_field(child, "history"))) == [
            "waiting",
            "enqueued",
            "running",
            "success",
        ]
    for proc in procs:
        assert proc.stop() == 0, proc.output()
