"""The worker server: one asyncio loop running N worker tasks plus its services.

Each worker claims one job at a time with a renewable lease, runs it through
the Executor and stores the outcome in one transaction. Services run beside
the workers: lease renewal, heartbeat, maintenance, wake-ups, supervision
and autoscaling. Nothing here decides what a job's outcome is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

from later_django.conf import conf
from later_django.db.errors import is_transient
from later_django.db.sessions import HotPath
from later_django.leases import Leader
from later_django.maintenance.runner import Maintenance
from later_django.maintenance.steps import StepContext
from later_django.store import Store, new_pool
from later_django.types import ClaimedJob
from later_django.worker import supervisor
from later_django.worker.batching import Coalescer
from later_django.worker.executor import Executor, Outcome
from later_django.worker.notifier import Notifier, Wakeup
from later_django.worker.status import OutcomeCounts, StatusReporter

logger = logging.getLogger(__name__)

MAX_WORKERS = 255
CLAIM_ERROR_BACKOFF = 1.0  # seconds a worker waits after a failed claim
FINISH_RETRY_MAX = 5.0  # cap, in seconds, of the backoff between finish attempts
SERVICE_RESTART_MAX = 30.0  # cap, in seconds, of a crashed service's restart backoff
COMPLETE_BATCH = 256  # successes stored by one statement at most
DB_THREADS = 16  # threads (and connections) storing failures and retries
PG_BACKSTOP_POLL = 1.0  # seconds; LISTEN wakes workers, this only covers a lost listener
CONNECTION_CLOSE_TIMEOUT = 2.0  # seconds shutdown waits for pool threads to release connections
# A lease counts as confirmed until this long before it expires, as last
# confirmed (a tenth of the lease, at most 2 s); the handlers are checked
# every half margin, so each stops at least half a margin before its lease
# could expire.
LEASE_MARGIN_FRACTION = 0.1
LEASE_MARGIN_MAX = 2.0  # seconds

Claim = tuple[str, int]  # (job id, attempt): what a lease fences


@dataclass(eq=False)
class WorkerSlot:
    """One worker task and what the supervisor watches of it."""

    id: int
    task: asyncio.Task[None] | None = None
    last_active: float = field(default_factory=time.monotonic)
    busy_since: float | None = None
    current_job: str | None = None
    current_claim: Claim | None = None
    # The running handler, cancelled if the job's lease is lost (a sync one
    # cannot be stopped: its thread goes on, the worker stops waiting for it).
    run_task: asyncio.Task[Outcome] | None = None
    # The store of this worker's last outcome, if it is still in flight.
    finishing: asyncio.Future[None] | None = None
    cancellable: bool = False
    lease_lost: bool = False
    stopping: bool = False
    reported_slow: bool = False

    def touch(self) -> None:
        self.last_active = time.monotonic()


class Server:
    """A supervised pool of workers sharing the LATER database and namespace."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        autoscale: tuple[int, int] | None = None,
        shutdown_timeout: float | None = None,
    ) -> None:
        self.alias = conf.database
        self.namespace = conf.namespace
        self.initial_workers = int(workers if workers is not None else conf.WORKERS)
        autoscale = autoscale if autoscale is not None else conf.AUTOSCALE
        self.autoscale = tuple(autoscale) if autoscale else None
        if not 1 <= self.initial_workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {self.initial_workers}")
        if self.autoscale and not 1 <= self.autoscale[0] <= self.autoscale[1] <= MAX_WORKERS:
            raise ValueError(f"autoscale must be (min, max) within 1..{MAX_WORKERS}")
        if self.autoscale:
            self.initial_workers = min(
                max(self.initial_workers, self.autoscale[0]), self.autoscale[1]
            )
        self.shutdown_timeout = (
            shutdown_timeout if shutdown_timeout is not None else conf.seconds("SHUTDOWN_TIMEOUT")
        )
        host = socket.gethostname()[:40]
        self.server_id = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lease_ms = conf.millis("LEASE_DURATION")
        lease = self.lease_ms / 1000
        # How long a lease stays confirmed after the statement that set it
        # was sent: the database set its expiry no earlier than that.
        margin = min(lease * LEASE_MARGIN_FRACTION, LEASE_MARGIN_MAX)
        self.confirmed_for = lease - margin
        self.deadline_check_interval = margin / 2
        self.retention_ms = conf.millis("DASHBOARD_RETENTION")
        self.store = Store(self.alias)
        self.wake = Wakeup()
        self.slots: list[WorkerSlot] = []
        self._spares: deque[ClaimedJob] = deque()
        self._background: set[asyncio.Future[None]] = set()
        # Every claim this server holds a lease on (running, spare, or its
        # outcome being stored), and until when (loop time) the lease is
        # known to hold: renewals extend it; past it, the claim is given up.
        self._leases: dict[Claim, float] = {}
        # Claims whose handler ended and whose outcome is being stored.
        self._unstored: dict[Claim, ClaimedJob] = {}
        self._finishing: set[asyncio.Future[None]] = set()
        self._claims: Coalescer[None, ClaimedJob | None] = Coalescer(
            self._claim_batch, max_batch=MAX_WORKERS, on_abandoned=self._keep_spare
        )
        self._completions: Coalescer[tuple[str, int], bool] = Coalescer(
            self._complete_batch, max_batch=COMPLETE_BATCH
        )
        self.processed = 0
        # Outcomes stored since the last status line.
        self.outcomes = OutcomeCounts()
        self.status = StatusReporter(self.outcomes, self.ready_backlog, lambda: self.worker_count)
        self.stopping = False
        self.closed = asyncio.Event()
        self._next_slot_id = 0
        self._services: dict[str, asyncio.Task[None]] = {}
        # Claims and successes go through the hot path (connections of their
        # own); only failures and retries use this pool, one statement each.
        self._db_pool = new_pool("db", 1 if self.store.dialect.single_writer else DB_THREADS)
        self._service_pool = new_pool("service", 4)
        self._handler_pool = new_pool("handler", MAX_WORKERS + 1)
        # Claims and completions each have a connection of their own, so a
        # worker's next claim never waits behind the store of its last outcome.
        self._claim_path = HotPath(self.alias)
        self._complete_path = HotPath(self.alias)
        self.executor = Executor(self._handler_pool, app=self._build_app())
        self.notifier = Notifier(
            self.wake,
            alias=self.alias,
            namespace=self.namespace,
            listen=self.store.dialect.supports_listen,
            watch=self.store.dialect.supports_change_counter,
        )
        vacuum = conf.VACUUM_INTERVAL
        self.leader = Leader(namespace=self.namespace, owner=self.server_id, ttl_ms=self.lease_ms)
        self.maintenance = Maintenance(
            self.store,
            new_pool("maintenance", 2),
            StepContext(
                alias=self.alias,
                namespace=self.namespace,
                retention_ms=self.retention_ms,
                stuck_grace_ms=conf.millis("STUCK_JOB_GRACE"),
                server_ttl_ms=max(4 * conf.millis("PARTITION_HEARTBEAT_TTL"), 60_000),
                vacuum_interval_ms=int(vacuum.total_seconds() * 1000) if vacuum else None,
                leader=self.leader,
            ),
            conf.seconds("MAINTENANCE_INTERVAL"),
            lease=self.lease_ms / 1000,
        )
        poll = conf.seconds("POLL_INTERVAL")
        self.poll_interval = max(poll, PG_BACKSTOP_POLL) if self.notifier.listen else poll

    @staticmethod
    def _build_app() -> Any:
        path = conf.CONTEXT
        if not path:
            return None
        factory = import_string(path) if isinstance(path, str) else path
        return factory()

    # -- lifecycle --------------------------------------------------------------
    @property
    def worker_count(self) -> int:
        return sum(1 for slot in self.slots if not slot.stopping)

    async def start(self) -> None:
        """Start the services and the workers; return once they run."""
        self.notifier.start()
        # Workers first, so the first heartbeat reports their number, not 0.
        for _ in range(self.initial_workers):
            self._spawn_worker()
        await self._heartbeat_once()
        self._start_service("renew", self._renew_loop)
        self._start_service("deadlines", self._deadline_loop)
        self._start_service("heartbeat", self._heartbeat_loop)
        self._start_service("maintenance", self.maintenance.run)
        self._start_service("supervisor", lambda: supervisor.supervise(self))
        self._start_service("status", self.status.run)
        if self.autoscale:
            self._start_service("autoscale", lambda: supervisor.autoscale(self))
        logger.info(
            "later server %s started: %d workers on %s, namespace %r",
            self.server_id,
            self.worker_count,
            self.alias,
            self.namespace,
            extra={"action": "server_started"},
        )

    async def add_worker(self) -> int:
        """Start one more worker (at most 255); return the new count."""
        if self.worker_count >= MAX_WORKERS:
            raise ValueError(f"a server runs at most {MAX_WORKERS} workers")
        self._spawn_worker()
        return self.worker_count

    async def remove_worker(self) -> int:
        """Stop one worker after its current job; at least one remains.

        Returns the new count."""
        live = [slot for slot in self.slots if not slot.stopping]
        if len(live) <= 1:
            return len(live)
        idle = [slot for slot in live if slot.busy_since is None]
        slot = (idle or live)[-1]
        slot.stopping = True
        self.wake.wake()
        if slot.task is not None:
            await asyncio.wait([slot.task])
        if slot in self.slots:
            self.slots.remove(slot)
        return self.worker_count

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop claiming, let running handlers commit, then stop everything.

        Past ``timeout`` seconds, remaining handlers are cancelled; their jobs
        are recovered through their leases."""
        if self.stopping:
            await self.closed.wait()
            return
        self.stopping = True
        timeout = self.shutdown_timeout if timeout is None else timeout
        for name in ("supervisor", "autoscale"):
            await self._stop_service(name)
        for slot in self.slots:
            slot.stopping = True
        self.wake.wake()
        tasks = [slot.task for slot in self.slots if slot.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                logger.warning(
                    "shutdown deadline passed: aborting %d running jobs; their leases "
                    "expire and another server recovers them",
                    len(pending),
                    extra={"action": "shutdown_abort"},
                )
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=1.0)
        await self._release_spares()
        await self._end_finishing(timeout)
        for name in list(self._services):
            await self._stop_service(name)
        self.notifier.stop()
        try:
            await self.store.run(self._service_pool, self._deregister)
        except Exception as exc:  # noqa: BLE001  best effort: the rows expire anyway
            logger.warning("could not deregister server %s: %s", self.server_id, exc)
        for pool in (self._db_pool, self._service_pool, self._handler_pool, self.maintenance.pool):
            pool.shutdown(wait=False, cancel_futures=True)
        # Without this, each pool thread's connection stays open until garbage
        # collection (on PostgreSQL, a session per thread of an in-process server).
        await asyncio.to_thread(self.store.close, CONNECTION_CLOSE_TIMEOUT)
        await self.notifier.join(CONNECTION_CLOSE_TIMEOUT)
        for path in (self._claim_path, self._complete_path):
            await path.close()
        self.closed.set()
        logger.info(
            "later server %s stopped after %d jobs",
            self.server_id,
            self.processed,
            extra={"action": "server_stopped"},
        )

    async def _end_finishing(self, timeout: float) -> None:
        """Let outcomes still being stored finish, up to ``timeout``, then
        abandon the rest: their leases expire and the stuck-job recovery
        runs those jobs again. The sessions close first, so an abandoned
        store can never reconnect and write after shutdown."""
        pending = {future for future in self._finishing if not future.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout)
        if not pending:
            return
        for path in (self._claim_path, self._complete_path):
            await path.close()
        self._claims.reset()
        self._completions.reset()
        for future in pending:
            future.cancel()
        # Stores retried after the reset fail at once on the closed sessions;
        # whatever still runs after a grace period is cancelled, so no store
        # outlives shutdown.
        deadline = asyncio.get_running_loop().time() + CONNECTION_CLOSE_TIMEOUT
        while left := {future for future in self._finishing if not future.done()}:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                for future in left:
                    future.cancel()
                await asyncio.wait(left, timeout=1.0)
                return
            await asyncio.wait(left, timeout=min(remaining, 0.1))

    def _deregister(self, dialect: Any, cursor: Any) -> None:
        """Leave the cluster: another server leads at its next tick."""
        self.leader.release_all(dialect, cursor)
        dialect.server_remove(cursor, server_id=self.server_id)

    # -- workers ----------------------------------------------------------------
    def _spawn_worker(self) -> WorkerSlot:
        slot = WorkerSlot(id=self._next_slot_id)
        self._next_slot_id += 1
        slot.task = asyncio.create_task(self._worker_loop(slot), name=f"later-worker-{slot.id}")
        self.slots.append(slot)
        return slot

    def replace_worker(self, slot: WorkerSlot) -> WorkerSlot:
        if slot in self.slots:
            self.slots.remove(slot)
        return self._spawn_worker()

    async def claim(self) -> ClaimedJob | None:
        """Claim one job for the calling worker, or None when none is ready.

        Workers that claim at the same moment share one statement."""
        while self._spares:
            job = self._spares.popleft()
            if self._confirmed((job.id, job.attempts)):
                return job
            # Kept aside past its lease's deadline: no longer safe to start.
            self._leases.pop((job.id, job.attempts), None)
        return await self._claims.submit(None)

    def _confirmed(self, claim: Claim) -> bool:
        """Is the lease of ``claim`` still known to hold?"""
        until = self._leases.get(claim)
        return until is not None and asyncio.get_running_loop().time() < until

    async def _claim_batch(self, requests: list[None]) -> list[ClaimedJob | None]:
        # Never more than the workers asking: a claimed job must not wait idle.
        limit = len(requests)
        sent = asyncio.get_running_loop().time()
        jobs: list[ClaimedJob | None] = list(
            await self._claim_path.claim(
                namespace=self.namespace, owner=self.server_id, limit=limit, lease_ms=self.lease_ms
            )
        )
        until = sent + self.confirmed_for
        for job in jobs:
            assert job is not None
            self._leases[(job.id, job.attempts)] = until
        return jobs + [None] * (limit - len(jobs))

    async def _release_spares(self) -> None:
        """Give back jobs claimed for workers that stopped before taking them."""
        while self._spares:
            job = self._spares.popleft()
            try:
                await self.store.run(self._service_pool, functools.partial(self._unclaim, job))
            except Exception as exc:  # noqa: BLE001  its lease recovers it instead
                logger.warning("could not give back job %s: %s", job.id, exc)
            self._leases.pop((job.id, job.attempts), None)

    def _unclaim(self, job: ClaimedJob, dialect: Any, cursor: Any) -> bool:
        return bool(
            dialect.job_unclaim(cursor, job_id=job.id, attempts=job.attempts, owner=self.server_id)
        )

    def _keep_spare(self, job: ClaimedJob | None) -> None:
        """A job claimed for a worker that went away meanwhile: the next worker takes it."""
        if job is not None:
            self._spares.append(job)
            self.wake.wake()

    async def _complete_batch(self, requests: list[tuple[str, int]]) -> list[bool]:
        done, released = await self._complete_path.complete_many(
            owner=self.server_id, jobs=requests, retention_ms=self.retention_ms
        )
        if released:
            # Continuations just became ready: this server's idle workers need
            # not wait for a poll (SQLite) to find them.
            self.wake.wake()
        completed = set(done)
        return [job_id in completed for job_id, _ in requests]

    def abandon_hung_calls(self, threshold: float) -> list[str]:
        """Give up on a shared claim or completion stuck longer than ``threshold``."""
        abandoned = []
        now = time.monotonic()
        for name, coalescer in (("claim", self._claims), ("complete", self._completions)):
            started = coalescer.flush_started
            if started is not None and now - started > threshold:
                coalescer.reset()
                abandoned.append(name)
        return abandoned

    async def _worker_loop(self, slot: WorkerSlot) -> None:
        while not (slot.stopping or self.stopping):
            slot.touch()
            seen = self.wake.generation
            try:
                job = await self.claim()
            except Exception as exc:  # noqa: BLE001  back off instead of spinning
                logger.error(
                    "worker %d could not claim: %s; backing off",
                    slot.id,
                    exc,
                    extra={"action": "claim_error"},
                )
                await asyncio.sleep(CLAIM_ERROR_BACKOFF * random.uniform(0.5, 1.5))  # noqa: S311
                continue
            slot.touch()
            if job is None:
                # A wake-up during the claim (a commit it may have missed) claims again.
                await self.wake.wait(self.poll_interval, since=seen)
                continue
            claim = (job.id, job.attempts)
            slot.current_job, slot.current_claim = job.id, claim
            slot.busy_since, slot.reported_slow = time.monotonic(), False
            slot.lease_lost, slot.cancellable = False, self.executor.is_async(job)
            slot.run_task = asyncio.create_task(self.executor.run(job))
            try:
                try:
                    outcome = await slot.run_task
                except asyncio.CancelledError:
                    if not slot.lease_lost:
                        raise  # this worker itself is being stopped
                    continue  # the lease is gone: the job is not this worker's now
                # The worker claims its next job while this outcome is stored
                # (claims and completions overlap), but never leaves more than
                # one outcome of its own unstored.
                await self._outcome_stored(slot)
                slot.finishing = self._start_finish(job, outcome)
            finally:
                slot.current_job, slot.current_claim = None, None
                slot.busy_since, slot.run_task = None, None
            self.processed += 1
        await self._outcome_stored(slot)

    async def _deadline_loop(self) -> None:
        while True:
            await asyncio.sleep(self.deadline_check_interval)
            self.stop_unconfirmed()

    def stop_unconfirmed(self) -> None:
        """Stop every handler whose lease is no longer confirmed.

        Renewals move each claim's deadline on; when none confirmed a lease in
        time (the database unreachable, this process frozen), its handler
        stops before the lease expires, so it never runs beside a recovered
        run. One periodic check instead of a timer per job: a job costs no
        timer to arm and cancel."""
        now = asyncio.get_running_loop().time()
        for slot in self.slots:
            claim = slot.current_claim
            if claim is None or slot.lease_lost or slot.run_task is None or slot.run_task.done():
                continue
            until = self._leases.get(claim)
            if until is None or now >= until:
                self._leases.pop(claim, None)
                self._stop_handler(slot, claim, "its lease could not be renewed in time")

    def _stop_handler(self, slot: WorkerSlot, claim: Claim, why: str) -> None:
        """Stop the handler ``slot`` runs for ``claim``; its outcome is never stored."""
        job_id, attempt = claim
        if slot.cancellable:
            logger.warning(
                "cancelled handler of job %s attempt %d: %s",
                job_id,
                attempt,
                why,
                extra={"action": "handler_cancelled", "job_id": job_id},
            )
        else:
            # A thread cannot be stopped; waiting for it would let a handler
            # that never returns hold this worker for good (docs/chaos.md).
            logger.warning(
                "abandoned sync handler of job %s attempt %d: %s; it goes on in its "
                "thread, its outcome will be discarded, and worker %d moves on",
                job_id,
                attempt,
                why,
                slot.id,
                extra={"action": "handler_abandoned", "job_id": job_id},
            )
        slot.lease_lost = True
        if slot.run_task is not None:
            slot.run_task.cancel()

    def _start_finish(self, job: ClaimedJob, outcome: Outcome) -> asyncio.Future[None]:
        """Store ``outcome`` apart from the worker (a cancelled worker must still
        record what its job did); the future is done once it is stored."""
        claim = (job.id, job.attempts)
        self._unstored[claim] = job
        if outcome.kind != "succeeded":
            return self._finish_in_task(job, outcome)
        # The common case costs no task: the shared completion's own future
        # says when it is stored. Only a failed store falls back to the
        # retrying task.
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._finishing.add(finished)
        finished.add_done_callback(self._finishing.discard)

        def on_stored(stored: asyncio.Future[bool]) -> None:
            error = None if stored.cancelled() else stored.exception()
            if finished.done():
                return  # abandoned at shutdown
            if stored.cancelled() or error is not None:
                self._log_finish_error(job, error or "cancelled")
                retry = self._finish_in_task(job, outcome)
                retry.add_done_callback(lambda _: _resolve(finished))
                return
            self._unstored.pop(claim, None)
            self._leases.pop(claim, None)
            self._log_outcome(job, outcome, stored.result())
            _resolve(finished)

        self._completions.submit_nowait((job.id, job.attempts)).add_done_callback(on_stored)
        return finished

    def _finish_in_task(self, job: ClaimedJob, outcome: Outcome) -> asyncio.Future[None]:
        claim = (job.id, job.attempts)
        task = asyncio.ensure_future(self._finish(job, outcome))
        self._finishing.add(task)

        def done(_: object) -> None:
            self._finishing.discard(task)
            self._unstored.pop(claim, None)
            self._leases.pop(claim, None)

        task.add_done_callback(done)
        return task

    @staticmethod
    async def _outcome_stored(slot: WorkerSlot) -> None:
        if slot.finishing is not None:
            if not slot.finishing.done():
                await asyncio.shield(slot.finishing)
            slot.finishing = None

    async def _finish(self, job: ClaimedJob, outcome: Outcome) -> None:
        """Store ``outcome``, retrying transient errors while the lease holds.

        A permanent error, or a lease about to expire, ends the attempts: the
        claim is let go, so its lease expires and the stuck-job recovery
        retries the job (on this server or another)."""
        claim = (job.id, job.attempts)
        loop = asyncio.get_running_loop()
        delay = 0.05
        while True:
            try:
                if outcome.kind == "succeeded":
                    stored = await self._completions.submit(claim)
                else:
                    stored = await self.store.run(
                        self._db_pool,
                        lambda d, c: self._store_outcome(d, c, job, outcome),
                        atomic=True,
                    )
                break
            except Exception as exc:  # noqa: BLE001  sorted below
                if not is_transient(exc):
                    self._give_up_finish(job, exc, "the error is not transient")
                    return
                until = self._leases.get(claim)
                if until is None or loop.time() + delay >= until:
                    self._give_up_finish(job, exc, "its lease could not be renewed in time")
                    return
                self._log_finish_error(job, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, FINISH_RETRY_MAX)
        self._log_outcome(job, outcome, stored)
        if stored and outcome.kind == "retry" and outcome.delay_ms is not None:
            self._promote_after(outcome.delay_ms)

    def _give_up_finish(self, job: ClaimedJob, exc: BaseException, why: str) -> None:
        claim = (job.id, job.attempts)
        self._leases.pop(claim, None)
        self._unstored.pop(claim, None)
        logger.error(
            "gave up storing the outcome of job %s attempt %d (%s): %s; its lease "
            "expires and the stuck-job recovery runs it again",
            job.id,
            job.attempts,
            why,
            exc,
            extra={"action": "finish_abandoned", "job_id": job.id},
        )

    def _promote_after(self, delay_ms: int) -> None:
        """Promote a retry due before the next maintenance tick when it is due."""
        delay = max(delay_ms, 0) / 1000
        if delay >= self.maintenance.interval:
            return  # the regular maintenance tick comes first anyway
        loop = asyncio.get_running_loop()
        loop.call_later(delay, lambda: self._spawn_background(self._promote_now()))

    async def _promote_now(self) -> None:
        try:
            promoted = await self.maintenance.run_step("promote_due")
        except Exception as exc:  # noqa: BLE001  the maintenance tick promotes it
            logger.debug("early promotion failed: %s", exc)
            return
        if promoted:
            self.wake.wake()

    def _spawn_background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        # Keep a reference until done: the loop holds tasks only weakly.
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _store_outcome(self, dialect: Any, cursor: Any, job: ClaimedJob, outcome: Outcome) -> bool:
        if outcome.kind == "retry":
            return bool(
                dialect.job_retry(
                    cursor,
                    job_id=job.id,
                    attempts=job.attempts,
                    owner=self.server_id,
                    delay_ms=outcome.delay_ms or 0,
                    error=outcome.error,
                    retry_policy=outcome.resolved_policy,
                )
            )
        return bool(
            dialect.job_fail(
                cursor,
                job_id=job.id,
                attempts=job.attempts,
                owner=self.server_id,
                retention_ms=self.retention_ms,
                error=outcome.error,
            )
        )

    @staticmethod
    def _log_finish_error(job: ClaimedJob, error: object) -> None:
        logger.error(
            "could not store the outcome of job %s: %s; retrying",
            job.id,
            error,
            extra={"action": "finish_error", "job_id": job.id},
        )

    def _log_outcome(self, job: ClaimedJob, outcome: Outcome, stored: bool) -> None:
        extra = {"action": f"job_{outcome.kind}", "job_id": job.id, "job_type": job.type_name}
        if stored:
            self.outcomes.add(outcome.kind)
        if not stored:
            logger.warning(
                "job %s (%s) finished after its lease was taken over; its outcome was discarded",
                job.id,
                job.type_name,
                extra={**extra, "action": "lease_lost"},
            )
        elif outcome.kind == "failed":
            logger.error(
                "job %s (%s) failed on attempt %d: %s",
                job.id,
                job.type_name,
                job.attempts,
                _first_line(outcome.error),
                extra=extra,
                exc_info=outcome.exc,
            )
        elif outcome.kind == "retry":
            logger.warning(
                "job %s (%s) attempt %d failed, retrying: %s",
                job.id,
                job.type_name,
                job.attempts,
                _first_line(outcome.error),
                extra=extra,
            )
        else:
            logger.debug("job %s (%s) succeeded", job.id, job.type_name, extra=extra)

    # -- services ---------------------------------------------------------------
    def _start_service(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        self._services[name] = asyncio.create_task(
            self._restarting(name, factory), name=f"later-{name}"
        )

    async def _stop_service(self, name: str) -> None:
        task = self._services.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    def restart_service(self, name: str) -> None:
        factories = {"maintenance": self.maintenance.run}
        task = self._services.pop(name, None)
        if task is not None:
            task.cancel()
        self._start_service(name, factories[name])

    def service_task(self, name: str) -> asyncio.Task[None] | None:
        return self._services.get(name)

    async def _restarting(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        delay = 0.5
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception(
                    "later service %s crashed; restarting in %.1fs",
                    name,
                    delay,
                    extra={"action": "service_crash", "service": name},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, SERVICE_RESTART_MAX)

    async def _renew_loop(self) -> None:
        interval = self.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew_leases()
            except Exception as exc:  # noqa: BLE001  next renewal retries
                logger.error("could not renew leases: %s", exc, extra={"action": "renew_error"})

    async def renew_leases(self) -> list[Claim]:
        """Extend the lease of every claim this server holds; return the claims lost.

        Fenced by (job id, attempt): a claim is lost once another server
        recovered the job, even if this server claimed it again since. A
        handler still running a lost claim is stopped, so the job does not
        run twice at once."""
        held = list(self._leases)
        if not held:
            return []
        sent = asyncio.get_running_loop().time()
        renewed = set(
            await self.store.run(
                self._service_pool,
                lambda d, c: d.job_renew(
                    c, owner=self.server_id, jobs=held, lease_ms=self.lease_ms
                ),
            )
        )
        until = sent + self.confirmed_for
        lost = []
        for claim in held:
            if claim in renewed:
                if claim in self._leases:  # not finished meanwhile
                    self._leases[claim] = max(self._leases[claim], until)
            else:
                lost.append(claim)
                self._drop_lost_lease(claim)
        return lost

    def _drop_lost_lease(self, claim: Claim) -> None:
        self._leases.pop(claim, None)
        for job in list(self._spares):
            if (job.id, job.attempts) == claim:
                self._spares.remove(job)
        for slot in self.slots:
            if slot.current_claim == claim and slot.run_task is not None:
                if slot.run_task.done():
                    continue  # finished meanwhile: the fence decides
                self._stop_handler(slot, claim, "its lease was lost (another server recovered it)")

    async def ready_backlog(self) -> int:
        """Jobs ready to run now in this namespace, read from the counters."""
        counts = await self.store.run(
            self._service_pool, lambda d, c: d.stage_counts(c, namespace=self.namespace)
        )
        return counts["enqueued"]

    async def _heartbeat_once(self) -> None:
        await self.store.run(
            self._service_pool,
            lambda d, c: d.server_heartbeat(
                c,
                server_id=self.server_id,
                namespace=self.namespace,
                hostname=socket.gethostname()[:255],
                pid=os.getpid(),
                workers=self.worker_count,
            ),
        )

    async def _heartbeat_loop(self) -> None:
        interval = conf.seconds("PARTITION_HEARTBEAT_INTERVAL")
        while True:
            await asyncio.sleep(interval)
            try:
                await self._heartbeat_once()
            except Exception as exc:  # noqa: BLE001
                logger.error("heartbeat failed: %s", exc, extra={"action": "heartbeat_error"})


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0]
