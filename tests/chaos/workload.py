"""The chaos workload: a plan of jobs whose outcome is known when they are
enqueued, and the producer that enqueues it at a steady rate.

Expected outcomes:

- ``Work`` / ``AsyncWork`` (the bulk, plain, delayed, continuations of a
  job that succeeds): ``success``;
- ``Flaky(succeed_on=k)``: ``success`` when 1 <= k <= retries + 1, else
  ``failed`` (it raises on every attempt);
- a continuation of a job expected to fail: ``failed`` with ``parent failed``;
- a payload corrupted by a fault before any worker took it: ``failed`` with
  the decode error (set by the fault when its UPDATE hits the row);
- ``Ordered`` / ``AsyncOrdered`` (partitioned, over ``ORDERED_KEYS`` keys;
  some fail their first attempt): ``success``, each key's jobs one at a
  time in enqueue order;
- ``Hang`` / ``AsyncHang``: ``running`` forever (or waiting to be re-run after
  its process was killed): still legitimately pending at the end.

Besides the plan, the producer registers the profile's recurring schedules
(``Tick`` payloads) before the load and removes them when it ends; their
occurrences are rows with ``recurring = identifier``, checked by the report
against the cron (``Recurring``, ``OccurrenceWatcher``).
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import Error as DjangoDbError
from django.db import connections, transaction

import later_django as later
from later_django import LaterBusy
from later_django.db import dialect_for
from tests.chaos.app.jobs import (
    FLAKY_RETRIES,
    AsyncHang,
    AsyncOrdered,
    AsyncWork,
    Flaky,
    Hang,
    Ordered,
    Tick,
    Work,
)

T = TypeVar("T")

SUCCESS, FAILED, RUNNING = "success", "failed", "running"
REASON_PARENT = "parent failed"
REASON_DECODE = "does not decode"
REASON_FLAKY = "chaos flaky job"
# Partition keys of the partitioned jobs: several per partition, so keys
# share partitions (8) and a partition's order covers jobs of many keys.
ORDERED_KEYS = 40
# The share of the plan that is partitioned.
ORDERED_SHARE = 0.15


@dataclass
class Planned:
    """One job of the plan and what must become of it."""

    n: int
    kind: str  # work awork flaky delayed child hang ahang ordered aordered
    expected: str
    reason: str = ""
    api: str = ""
    job_id: str | None = None
    parent_n: int | None = None
    enqueued_at: float = 0.0
    ready_at: float = 0.0
    children: int = 0
    corrupted_at: float | None = None
    # A partitioned job's partition key and place among that key's jobs.
    key: str | None = None
    seq: int | None = None


@dataclass
class Profile:
    name: str
    jobs: int  # planned jobs, about
    load_seconds: float  # the producer enqueues for this long
    drain_seconds: float  # then every job must be done within this
    fault_gap: tuple[float, float]  # seconds between two faults
    max_delay: float  # longest delay of a delayed job
    hangs: int  # jobs whose handler never returns
    weights: dict[str, int] = field(default_factory=dict)  # extra faults, by kind
    # Recurring schedules registered for the load: (identifier, cron, how
    # long each occurrence's handler sleeps in ms); crons are read in UTC.
    recurring: list[tuple[str, str, int]] = field(default_factory=list)


PROFILES = {
    "ci": Profile(
        name="ci",
        jobs=4000,
        load_seconds=50,
        drain_seconds=60,
        fault_gap=(1.0, 2.5),
        max_delay=8,
        hangs=2,
        recurring=[
            ("chaos-every-second", "* * * * * *", 300),
            ("chaos-every-2s", "*/2 * * * * *", 0),
        ],
    ),
    "long": Profile(
        name="long",
        jobs=100_000,
        load_seconds=900,
        drain_seconds=300,
        fault_gap=(4.0, 12.0),
        max_delay=30,
        hangs=3,
        recurring=[
            ("chaos-every-second", "* * * * * *", 300),
            ("chaos-every-2s", "*/2 * * * * *", 0),
            ("chaos-every-minute", "* * * * *", 0),
        ],
    ),
}


@dataclass
class Recurring:
    """One recurring schedule of the run, and when (database clock, epoch ms)
    it was registered and removed: each a (before, after) bracket of the
    call, retries included, so the call's own clock read lies within it."""

    n: int
    identifier: str
    cron: str
    registered: tuple[int, int] = (0, 0)
    removed: tuple[int, int] | None = None
    # What enqueue_recurring returned: the first occurrence (None when a
    # retried call found the schedule already registered by its first try).
    first_job_id: str | None = None


def db_now() -> int:
    """The database's clock, epoch ms: what every stored time is on."""
    with connections["default"].cursor() as cursor:
        return dialect_for("default").clock_now(cursor)


class OccurrenceWatcher:
    """Remembers each recurring occurrence's ``run_at_ms`` (its fire time)
    while it still holds it.

    A retry (after a kill or a pause) moves an occurrence's ``run_at_ms`` to
    the retry's time, so the final rows no longer tell every fire time. An
    occurrence is visible from its insert, at least a lease before it can be
    retried, so polling every ``interval`` seconds sees each one first.
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.fire_ms: dict[str, int] = {}
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="chaos-occurrences", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def poll(self) -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT id, run_at_ms, history FROM later_job WHERE recurring IS NOT NULL "
                "AND stage IN ('delayed', 'enqueued', 'running')"
            )
            rows = cursor.fetchall()
        for job_id, run_at_ms, history in rows:
            if job_id not in self.fire_ms and "requeued@" not in history:
                self.fire_ms[job_id] = int(run_at_ms)

    def _run(self) -> None:
        try:
            while True:
                try:
                    self.poll()
                except DjangoDbError:
                    self.errors += 1  # the database is restarting: poll again
                    connections["default"].close()
                if self.stop.wait(self.interval):
                    break
            self.poll()  # the last word, after the workers stopped
        except DjangoDbError:
            self.errors += 1
        finally:
            connections["default"].close()


class Plan:
    """Every job the run enqueued, by workload number and by job id."""

    def __init__(self) -> None:
        self.jobs: list[Planned] = []
        self.by_id: dict[str, Planned] = {}
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "by_id": self.by_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def new(self, kind: str, expected: str, reason: str = "", **kw: Any) -> Planned:
        with self.lock:
            job = Planned(n=len(self.jobs), kind=kind, expected=expected, reason=reason, **kw)
            self.jobs.append(job)
        return job

    def bind(self, job: Planned, job_id: str, api: str) -> None:
        job.job_id = str(job_id)
        job.api = api
        job.enqueued_at = time.time()
        job.ready_at = max(job.ready_at, job.enqueued_at)
        with self.lock:
            self.by_id[job.job_id] = job

    def snapshot(self) -> list[Planned]:
        with self.lock:
            return list(self.jobs)


class Producer:
    """Enqueues the plan through the public API, retrying across database faults."""

    def __init__(self, plan: Plan, profile: Profile, rng: random.Random) -> None:
        self.plan = plan
        self.profile = profile
        self.rng = rng
        self.enqueue_errors = 0
        self.last_error = ""
        # Parents a late continuation may pick: finished or not, never delayed
        # (delayed jobs are what the corrupt fault changes) and never a hang.
        self._parents: list[Planned] = []
        # How many partitioned jobs each key has had: the next one's place.
        self._key_seq: dict[str, int] = {}

    # -- the public API, retried ---------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + 120
        while True:
            try:
                return fn()
            except (DjangoDbError, LaterBusy) as exc:
                # The database is restarting or locked. A failed commit may
                # have committed; its rows are found by ``n`` in the report.
                self.enqueue_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                if time.monotonic() > deadline:
                    raise
                connections["default"].close()
                time.sleep(0.2)

    def register_recurring(self) -> list[Recurring]:
        """Register the profile's schedules (``Tick(n=index)``, UTC)."""
        schedules = []
        for index, (identifier, cron, sleep_ms) in enumerate(self.profile.recurring):
            schedule = Recurring(n=index, identifier=identifier, cron=cron)
            before = self._call(db_now)
            payload = Tick(n=index, sleep_ms=sleep_ms)
            register = functools.partial(later.enqueue_recurring, identifier, payload, cron)
            first = self._call(register)
            schedule.registered = (before, self._call(db_now))
            schedule.first_job_id = None if first is None else str(first)
            schedules.append(schedule)
        return schedules

    def remove_recurring(self, schedules: list[Recurring]) -> None:
        """Remove the schedules; a retried call that finds one gone is fine
        (its first try committed)."""
        for schedule in schedules:
            before = self._call(db_now)
            self._call(functools.partial(later.remove_recurring, schedule.identifier))
            schedule.removed = (before, self._call(db_now))

    def enqueue_hang(self, index: int) -> Planned:
        kind, cls = ("hang", Hang) if index % 2 == 0 else ("ahang", AsyncHang)
        job = self.plan.new(kind, RUNNING)
        self.plan.bind(job, self._call(lambda: later.enqueue(cls(n=job.n))), "enqueue")
        return job

    # -- units of work -------------------------------------------------------------
    def _sleep_ms(self) -> int:
        roll = self.rng.random()
        if roll < 0.02:
            return self.rng.randint(300, 1500)  # slow: kills and pauses catch it running
        if roll < 0.12:
            return self.rng.randint(5, 50)
        return 0

    def _bulk(self, remaining: int) -> int:
        count = min(remaining, self.rng.randint(1, 25))
        jobs, payloads = [], []
        for _ in range(count):
            is_async = self.rng.random() < 0.3
            job = self.plan.new("awork" if is_async else "work", SUCCESS)
            jobs.append(job)
            cls = AsyncWork if is_async else Work
            payloads.append(cls(n=job.n, sleep_ms=self._sleep_ms()))
        ids = self._call(lambda: later.enqueue_many(payloads))
        for job, job_id in zip(jobs, ids, strict=True):
            self.plan.bind(job, job_id, "enqueue_many")
        self._parents.extend(jobs[:2])
        return count

    def _single(self) -> int:
        job = self.plan.new("work", SUCCESS)
        priority = self.rng.randint(-100, 100)
        payload = Work(n=job.n, sleep_ms=self._sleep_ms())
        self.plan.bind(
            job, self._call(lambda: later.enqueue(payload, priority=priority)), "enqueue"
        )
        self._parents.append(job)
        return 1

    def _flaky(self) -> int:
        succeed_on = self.rng.choice([0, 0, 1, 2, 3])
        expected = SUCCESS if 1 <= succeed_on <= FLAKY_RETRIES + 1 else FAILED
        job = self.plan.new("flaky", expected, "" if expected == SUCCESS else REASON_FLAKY)
        payload = Flaky(n=job.n, succeed_on=succeed_on)
        self.plan.bind(job, self._call(lambda: later.enqueue(payload)), "enqueue")
        self._parents.append(job)
        return 1

    def _delayed(self, latest: float) -> int:
        delay = self.rng.uniform(0.2, max(0.3, min(self.profile.max_delay, latest)))
        job = self.plan.new("delayed", SUCCESS, ready_at=time.time() + delay)
        payload = Work(n=job.n)
        if self.rng.random() < 0.5:
            job_id = self._call(lambda: later.enqueue_delayed(payload, dt.timedelta(seconds=delay)))
            api = "enqueue_delayed"
        else:
            when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay)
            job_id = self._call(lambda: later.enqueue_delayed_at(payload, when))
            api = "enqueue_delayed_at"
        self.plan.bind(job, job_id, api)
        return 1

    def _child_of(self, parent: Planned) -> Planned:
        assert parent.job_id is not None
        ok = parent.expected == SUCCESS
        child = self.plan.new(
            "child", SUCCESS if ok else FAILED, "" if ok else REASON_PARENT, parent_n=parent.n
        )
        parent.children += 1
        payload = Work(n=child.n)
        parent_id = parent.job_id
        self.plan.bind(
            child,
            self._call(lambda: later.enqueue_continue(parent_id, payload)),
            "enqueue_continue",
        )
        return child

    def _chain(self) -> int:
        if self.rng.random() < 0.7:
            parent = self.plan.new("work", SUCCESS)
            payload: object = Work(n=parent.n, sleep_ms=self._sleep_ms())
        else:
            succeed_on = self.rng.choice([0, 2])
            expected = SUCCESS if succeed_on else FAILED
            parent = self.plan.new("flaky", expected, "" if succeed_on else REASON_FLAKY)
            payload = Flaky(n=parent.n, succeed_on=succeed_on)
        self.plan.bind(parent, self._call(lambda: later.enqueue(payload)), "enqueue")
        made, node = 1, parent
        for _ in range(self.rng.randint(1, 3)):
            node = self._child_of(node)
            made += 1
        return made

    def _late_child(self) -> int:
        if not self._parents:
            return self._single()
        parent = self.rng.choice(self._parents[-2000:])
        self._child_of(parent)
        return 1

    def _ordered_job(self) -> tuple[Planned, object]:
        """The next partitioned job of a random key, and its payload."""
        key = f"k{self.rng.randrange(ORDERED_KEYS):02d}"
        seq = self._key_seq.get(key, 0)
        self._key_seq[key] = seq + 1
        is_async = self.rng.random() < 0.4
        job = self.plan.new("aordered" if is_async else "ordered", SUCCESS, key=key, seq=seq)
        cls = AsyncOrdered if is_async else Ordered
        fail_first = self.rng.random() < 0.1  # its retry must keep its place
        return job, cls(n=job.n, key=key, seq=seq, sleep_ms=self._sleep_ms(), fail_first=fail_first)

    def _ordered(self, remaining: int) -> int:
        """1-3 partitioned jobs: one call each, or all in one transaction
        (``enqueue_to_partition_in``). A retried transaction enqueues the same
        payloads again, so an ambiguous commit leaves twins at the same place."""
        made = [self._ordered_job() for _ in range(min(remaining, self.rng.randint(1, 3)))]
        if self.rng.random() < 0.3:
            payloads = [payload for _, payload in made]

            def in_transaction() -> list[Any]:
                with transaction.atomic(using="default"):
                    return [later.enqueue_to_partition_in(p) for p in payloads]

            ids, api = self._call(in_transaction), "enqueue_to_partition_in"
        else:
            ids = [self._call(functools.partial(later.enqueue_to_partition, p)) for _, p in made]
            api = "enqueue_to_partition"
        for (job, _), job_id in zip(made, ids, strict=True):
            self.plan.bind(job, job_id, api)
        return len(made)

    def produce(self, seconds: float, stop: threading.Event) -> None:
        """Enqueue exactly ``profile.jobs`` jobs evenly over ``seconds``."""
        units = [
            self._bulk,
            self._single,
            self._flaky,
            self._delayed,
            self._chain,
            self._late_child,
        ]
        weights = [60, 8, 7, 8, 9, 8]
        started = time.monotonic()
        end = started + seconds
        made = ordered = 0
        while not stop.is_set():
            now = time.monotonic()
            # The last turn tops the plan up to exactly ``profile.jobs``.
            due = min(self.profile.jobs, int(self.profile.jobs * (now - started) / seconds))
            if now >= end:
                due = self.profile.jobs
            while made < due:
                if ordered < ORDERED_SHARE * due:  # a steady share, whatever the units
                    count = self._ordered(due - made)
                    ordered += count
                    made += count
                    continue
                unit = self.rng.choices(units, weights)[0]
                if due - made < 5:
                    unit = self._bulk  # a chain could overshoot the total
                if unit == self._bulk:
                    made += self._bulk(due - made)
                elif unit == self._delayed:
                    made += self._delayed(end - time.monotonic())
                else:
                    made += unit()  # type: ignore[operator]
            if now >= end:
                break
            time.sleep(0.05)
