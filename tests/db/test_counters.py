"""Stage counters stay equal to COUNT(*) per stage through any mix of changes."""

from __future__ import annotations

import contextlib
import datetime as dt
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.test import override_settings

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import (
    ClaimRequest,
    ExpiredFence,
    FailureWrite,
    OwnerFence,
    RetryWrite,
    SuccessBatch,
)
from later_django.ids import new_job_id
from later_django.models import Job
from later_django.states import Stage
from tests.jobapp.jobs import AsyncNoop, Noop, Order

NAMESPACES = ("default", "other")
DAY_MS = 86_400_000
OPERATIONS = 400


class Rollback(Exception):
    """Raised inside an atomic block to roll it back."""


class Mix:
    """Random operations on later's tables, through the API and the dialect."""

    def __init__(self, later_db, settings, seed: int) -> None:
        self.db = later_db
        self.rng = random.Random(seed)
        self.dialect = dialect_for(later_db.alias)
        self.base_later = dict(settings.LATER)
        self.namespace = "default"
        self.compactions: list[int] = []

    # -- helpers -------------------------------------------------------------
    @contextlib.contextmanager
    def use(self, namespace: str) -> Iterator[None]:
        """Run the API calls of the block in ``namespace``."""
        with override_settings(LATER={**self.base_later, "NAMESPACE": namespace}):
            self.namespace = namespace
            try:
                yield
            finally:
                self.namespace = "default"

    def cursor(self):  # type: ignore[no-untyped-def]
        return connections[self.db.alias].cursor()

    def ids(self, stage: str | None = None) -> list[str]:
        sql = "SELECT id FROM later_job WHERE namespace = %s"
        params: list[object] = [self.namespace]
        if stage is not None:
            sql += " AND stage = %s"
            params.append(stage)
        return sorted(str(row[0]) for row in self.db.rows(sql + " ORDER BY id", params))

    def running(self) -> list[tuple[str, int, str]]:
        return [
            (str(r[0]), int(r[1]), str(r[2]))  # type: ignore[call-overload]
            for r in self.db.rows(
                "SELECT id, attempts, lease_owner FROM later_job "
                "WHERE namespace = %s AND stage = 'running' ORDER BY id",
                [self.namespace],
            )
        ]

    def payload(self) -> object:
        kind = self.rng.randrange(3)
        n = self.rng.randrange(1000)
        return (Noop(n=n), AsyncNoop(n=n), Order(id=n))[kind]

    def retention(self) -> int:
        # Half of the finished jobs expire at once, so prune finds work.
        return self.rng.choice([0, DAY_MS])

    # -- operations ----------------------------------------------------------
    def op_enqueue(self) -> None:
        later.enqueue(self.payload(), priority=self.rng.randint(-100, 100))

    def op_enqueue_in(self) -> None:
        with transaction.atomic(using=self.db.alias):
            later.enqueue_in(self.payload())

    def op_enqueue_many(self) -> None:
        later.enqueue_many([self.payload() for _ in range(self.rng.randint(1, 12))])

    def op_enqueue_delayed(self) -> None:
        delay = dt.timedelta(seconds=self.rng.choice([0, 1, 30, 600, 7200]))
        later.enqueue_delayed(self.payload(), delay)

    def op_enqueue_continue(self) -> None:
        ids = self.ids()
        if not ids or self.rng.random() < 0.15:
            with pytest.raises(later.JobNotFound):
                later.enqueue_continue(new_job_id(), self.payload())
            return
        later.enqueue_continue(self.rng.choice(ids), self.payload())

    def op_cancel(self) -> None:
        ids = self.ids()
        if not ids:
            return
        job_id = self.rng.choice(ids)
        stage = self.db.stage_of(job_id)
        # A running job is asked to stop (True, only marked): see op_claim's fences.
        unstarted_or_running = {"enqueued", "delayed", "waiting", "requeued", "running"}
        assert later.cancel(job_id) is (stage in unstarted_or_running)

    def op_claim(self) -> None:
        with transaction.atomic(using=self.db.alias), self.cursor() as c:
            self.dialect.hot.claim(
                c,
                ClaimRequest(
                    namespace=self.namespace,
                    owner=f"w{self.rng.randrange(4)}",
                    limit=self.rng.randint(1, 6),
                    lease_ms=self.rng.choice([0, 30_000]),
                ),
            )

    def op_complete(self) -> None:
        running = self.running()
        if running:
            job_id, attempts, owner = self.rng.choice(running)
            with transaction.atomic(using=self.db.alias), self.cursor() as c:
                done = self.dialect.hot.complete_many(
                    c,
                    SuccessBatch(
                        owner=owner, jobs=[(job_id, attempts)], retention_ms=self.retention()
                    ),
                ).done_ids
                assert done == [job_id]

    def op_fail(self) -> None:
        running = self.running()
        if running:
            job_id, attempts, owner = self.rng.choice(running)
            fence = OwnerFence(job_id=job_id, attempts=attempts, owner=owner)
            failure = FailureWrite(error="boom", retention_ms=self.retention())
            with transaction.atomic(using=self.db.alias), self.cursor() as c:
                if not self.dialect.hot.fail(c, fence, failure):
                    # cancel() asked it to stop: it ends cancelled instead, as
                    # the worker's store of a failure does.
                    assert self.dialect.hot.cancel_running(c, fence, self.retention())

    def op_retry(self) -> None:
        running = self.running()
        if running:
            job_id, attempts, owner = self.rng.choice(running)
            fence = OwnerFence(job_id=job_id, attempts=attempts, owner=owner)
            retry = RetryWrite(
                delay_ms=self.rng.choice([0, 1000, 60_000]), error="again", retry_policy=None
            )
            with transaction.atomic(using=self.db.alias), self.cursor() as c:
                if not self.dialect.hot.retry(c, fence, retry):
                    # cancel() asked it to stop: it ends cancelled instead, as
                    # the worker's store of a retry does.
                    assert self.dialect.hot.cancel_running(c, fence, self.retention())

    def op_stale_finish(self) -> None:
        """A finish with a lost lease, or for an earlier attempt, changes nothing."""
        running = self.running()
        if running:
            job_id, attempts, owner = self.rng.choice(running)
            stale = self.rng.choice([("intruder", attempts), (owner, attempts - 1)])
            with transaction.atomic(using=self.db.alias), self.cursor() as c:
                done = self.dialect.hot.complete_many(
                    c, SuccessBatch(owner=stale[0], jobs=[(job_id, stale[1])], retention_ms=DAY_MS)
                ).done_ids
                assert done == []

    def op_rescue(self) -> None:
        """The rescuer fails or requeues a running job whose lease expired."""
        running = self.running()
        if running:
            job_id, attempts, _ = self.rng.choice(running)
            with transaction.atomic(using=self.db.alias), self.cursor() as c:
                if self.rng.random() < 0.5:
                    self.dialect.hot.fail(
                        c,
                        ExpiredFence(job_id=job_id, attempts=attempts, expired_for_ms=0),
                        FailureWrite(error="stuck", retention_ms=self.retention()),
                    )
                else:
                    self.dialect.hot.retry(
                        c,
                        ExpiredFence(job_id=job_id, attempts=attempts, expired_for_ms=0),
                        RetryWrite(delay_ms=0, error="stuck", retry_policy=None),
                    )

    def op_age(self) -> None:
        """Time passes for some rows: their due, expiry and lease times move back."""
        shift = self.rng.choice([1000, 60_000, 3 * 3_600_000, 2 * DAY_MS])
        with self.cursor() as c:
            c.execute(
                "UPDATE later_job SET run_at_ms = run_at_ms - %s, "
                "expires_ms = expires_ms - %s, lease_expires_ms = lease_expires_ms - %s "
                "WHERE namespace = %s",
                [shift, shift, shift, self.namespace],
            )

    def op_promote(self) -> None:
        with transaction.atomic(using=self.db.alias), self.cursor() as c:
            self.dialect.upkeep.promote_due(
                c, namespace=self.namespace, limit=self.rng.randint(1, 20)
            )

    def op_prune(self) -> None:
        with transaction.atomic(using=self.db.alias), self.cursor() as c:
            self.dialect.upkeep.prune(c, namespace=self.namespace, limit=self.rng.randint(1, 20))

    def op_orphans(self) -> None:
        with transaction.atomic(using=self.db.alias), self.cursor() as c:
            for orphan in self.dialect.upkeep.orphans(c, namespace=self.namespace, limit=10):
                self.dialect.upkeep.resolve_orphan(c, orphan, retention_ms=self.retention())

    def op_delete(self) -> None:
        ids = self.ids()
        if not ids:
            return
        victims = self.rng.sample(ids, min(len(ids), self.rng.randint(1, 4)))
        if self.rng.random() < 0.5:
            with self.cursor() as c:
                for job_id in victims:
                    c.execute("DELETE FROM later_job WHERE id = %s", [job_id])
        else:
            Job.objects.using(self.db.alias).filter(id__in=victims).delete()

    def op_rolled_back(self) -> None:
        """A few operations in a transaction that rolls back count for nothing."""
        before = later.stage_counts()
        with pytest.raises(Rollback), transaction.atomic(using=self.db.alias):
            for _ in range(self.rng.randint(1, 4)):
                self.rng.choice(self.simple_ops)()
            raise Rollback
        assert later.stage_counts() == before

    @property
    def simple_ops(self):  # type: ignore[no-untyped-def]
        return [
            self.op_enqueue,
            self.op_enqueue_many,
            self.op_enqueue_delayed,
            self.op_cancel,
            self.op_claim,
            self.op_complete,
            self.op_fail,
            self.op_promote,
            self.op_age,
            self.op_prune,
            self.op_delete,
        ]

    def compact(self) -> None:
        with transaction.atomic(using=self.db.alias), self.cursor() as c:
            c.execute(
                "SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [self.namespace]
            )
            rows_before = int(c.fetchone()[0])
            folded = self.dialect.upkeep.counter_compact(c, namespace=self.namespace)
            c.execute(
                "SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [self.namespace]
            )
            rows_after = int(c.fetchone()[0])
        # PostgreSQL folds its delta rows into one per stage and lane; SQLite
        # has one already.
        assert folded == (rows_before if rows_before > 2 * len(Stage) else 0)
        assert rows_after <= (len(Stage) if folded else 2 * len(Stage))
        self.compactions.append(folded)

    def step(self) -> str:
        namespace = self.rng.choice(NAMESPACES)
        weighted = [
            (self.op_enqueue, 6),
            (self.op_enqueue_in, 2),
            (self.op_enqueue_many, 2),
            (self.op_enqueue_delayed, 3),
            (self.op_enqueue_continue, 5),
            (self.op_cancel, 3),
            (self.op_claim, 5),
            (self.op_complete, 3),
            (self.op_fail, 2),
            (self.op_retry, 2),
            (self.op_stale_finish, 1),
            (self.op_rescue, 1),
            (self.op_promote, 2),
            (self.op_prune, 2),
            (self.op_orphans, 1),
            (self.op_delete, 2),
            (self.op_rolled_back, 1),
        ]
        op = self.rng.choices([o for o, _ in weighted], [w for _, w in weighted])[0]
        with self.use(namespace):
            op()
        return op.__name__

    # -- the invariant ---------------------------------------------------------
    def assert_counters_match(self, context: str) -> None:
        for namespace in NAMESPACES:
            expected = dict.fromkeys((s.value for s in Stage), 0)
            for stage, n in self.db.rows(
                "SELECT stage, COUNT(*) FROM later_job WHERE namespace = %s GROUP BY stage",
                [namespace],
            ):
                expected[str(stage)] = int(n)  # type: ignore[call-overload]
            with self.use(namespace):
                assert later.stage_counts() == expected, f"{namespace} after {context}"


@pytest.mark.parametrize("seed", [1, 2])
def test_stage_counts_equal_count_per_stage_after_random_changes(later_db, settings, seed):
    """Counters equal COUNT(*) per stage and namespace after every one of a few
    hundred random enqueues, continuations, cancels, claims, finishes, promotions,
    prunes, deletes and rolled-back transactions; compaction keeps them equal."""
    mix = Mix(later_db, settings, seed)
    seen: set[str] = set()
    for index in range(OPERATIONS):
        name = mix.step()
        seen.add(name)
        mix.assert_counters_match(f"operation {index} ({name})")
        if index % 50 == 49:
            for namespace in NAMESPACES:
                with mix.use(namespace):
                    mix.compact()
            mix.assert_counters_match(f"compaction after operation {index}")
    # The mix really exercised the interesting paths.
    assert len(seen) >= 15, sorted(seen)
    stages = {str(row[0]) for row in later_db.rows("SELECT DISTINCT stage FROM later_job")}
    history = "".join(str(row[0]) for row in later_db.rows("SELECT history FROM later_job"))
    assert {"success", "failed", "cancelled", "enqueued"} <= stages
    assert "waiting@" in history and "requeued@" in history and "delayed@" in history
    assert len(mix.compactions) == 2 * (OPERATIONS // 50)


def test_stage_counts_ignore_other_namespaces(later_db, settings):
    """Each namespace counts only its own jobs."""
    base = dict(settings.LATER)
    later.enqueue(Noop())
    settings.LATER = {**base, "NAMESPACE": "other"}
    later.enqueue_many([Noop(), Noop()])
    later.enqueue_delayed(Noop(), dt.timedelta(hours=1))
    assert later.stage_counts()["enqueued"] == 2
    assert later.stage_counts()["delayed"] == 1
    settings.LATER = base
    assert later.stage_counts() == {**dict.fromkeys(Stage, 0), "enqueued": 1}


def test_stage_counts_stay_exact_where_a_counts_first_row_rolls_back(later_db):
    """The first job of a stage makes its count's row. Made in a savepoint
    that rolls back, inside a block that commits, the row goes and the
    counts of the committed jobs stay; the next job of that stage, in
    autocommit, counts from zero again."""

    def counts() -> dict[str, int]:
        return {stage: n for stage, n in later.stage_counts().items() if n}

    with transaction.atomic(using=later_db.alias):
        later.enqueue(Noop(n=0))
        with contextlib.suppress(Rollback), transaction.atomic(using=later_db.alias):
            later.enqueue_delayed(Noop(n=1), dt.timedelta(hours=1))
            assert counts() == {"enqueued": 1, "delayed": 1}
            raise Rollback
        later.enqueue(Noop(n=2))
    assert counts() == {"enqueued": 2}
    later.enqueue_delayed(Noop(n=3), dt.timedelta(hours=1))
    later.enqueue(Noop(n=4))
    assert counts() == {"enqueued": 3, "delayed": 1}
    truth = dict(later_db.rows("SELECT stage, COUNT(*) FROM later_job GROUP BY stage"))
    assert counts() == truth


def test_an_enqueue_commit_writes_its_row_its_indexes_and_its_count(later_db):
    """An enqueue in autocommit writes four pages to SQLite's WAL: the job's
    row, its id and ready index entries, and its stage's count (version 6's
    upsert of the count also rewrote the counts' sqlite_sequence row)."""
    if not dialect_for(later_db.alias).single_writer:
        pytest.skip("PostgreSQL has no WAL of whole pages to count")
    db = connections[later_db.alias]
    later.enqueue(Noop())  # its count's row exists: the next ones update it
    wal = Path(f"{db.settings_dict['NAME']}-wal")
    with db.cursor() as cursor:
        page_size = cursor.execute("PRAGMA page_size").fetchone()[0]
        busy = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    assert (busy, wal.stat().st_size) == (0, 0)
    enqueues = 50
    for n in range(enqueues):
        later.enqueue(Noop(n=n))
    # The WAL's header, then a header and a page per frame.
    frames = (wal.stat().st_size - 32) / (24 + page_size)
    # A few more where a page splits as the rows grow.
    assert 4 * enqueues <= frames < 4.5 * enqueues
