"""The worker tasks: each claims one job at a time, runs it through the
Executor, and hands its outcome to the Completer.

A worker claims its next job while its last outcome is stored (claims and
completions overlap), but never leaves more than one outcome of its own
unstored. A handler whose claim is given up (its lease lost, or no longer
confirmed) is stopped: an async one cancelled, a sync one abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from later_django import events, tracing
from later_django.types import ClaimedJob
from later_django.worker.claimer import Claimer
from later_django.worker.completer import Completer, Ran
from later_django.worker.executor import CANCELLED, Executor, Outcome
from later_django.worker.lease_book import Claim
from later_django.worker.notifier import Wakeup
from later_django.worker.overruns import Overruns
from later_django.worker.partitions import PartitionClaimer
from later_django.worker.services import ServiceGroup

logger = logging.getLogger(__name__)

MAX_WORKERS = 255
CLAIM_ERROR_BACKOFF = 1.0  # seconds a worker waits after a failed claim


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
    # Why the worker loop ended with an error, if it did.
    crash: BaseException | None = None
    # Waiting for work: no progress is expected of it.
    idle: bool = False
    cancellable: bool = False
    lease_lost: bool = False
    # cancel() asked the running job to stop: its attempt ends cancelled.
    cancel_asked: bool = False
    stopping: bool = False
    reported_slow: bool = False

    def touch(self) -> None:
        self.last_active = time.monotonic()


def _not_cancelled_itself() -> bool:
    """Is the running task going on (not being cancelled itself)?"""
    task = asyncio.current_task()
    return task is None or task.cancelling() == 0


class WorkerPool:
    def __init__(
        self,
        *,
        claimer: Claimer | PartitionClaimer,
        completer: Completer,
        executor: Executor,
        owner: str,
        wake: Wakeup,
        poll_interval: float,
        tasks: ServiceGroup,
        first_id: int = 0,
        kind: str = "worker",
        queue: str = "default",
        wake_when_stored: bool = False,
    ) -> None:
        self.claimer = claimer
        self.completer = completer
        self.executor = executor
        self.owner = owner
        self.wake = wake
        self.poll_interval = poll_interval
        self.slots: list[WorkerSlot] = []
        self.processed = 0
        self.stopping = False
        # Jobs whose handler this pool cancelled itself while stopping: no
        # outcome, nothing left running, so they can be given back at once.
        self.stopped_jobs: list[ClaimedJob] = []
        self.tasks = tasks  # owns every worker task
        # Partition workers are numbered apart (from 1000), so logs and
        # metrics tell them from plain ones.
        self._next_slot_id = first_id
        self.kind = kind
        # The queue whose jobs it runs (metrics label them so).
        self.queue = queue
        # Wake a worker of the queue once each outcome is stored: a queue
        # whose claims keep concurrency keys, where a finished job may free
        # a key the last claim found at its limit.
        self.wake_when_stored = wake_when_stored
        # Keyed jobs past their timeout whose sync handler still runs.
        self.overruns = Overruns(completer, self._wake_one)

    @property
    def count(self) -> int:
        return sum(1 for slot in self.slots if not slot.stopping)

    def spawn(self) -> WorkerSlot:
        slot = WorkerSlot(id=self._next_slot_id)
        self._next_slot_id += 1
        slot.task = self.tasks.create_task(self._run(slot), name=f"later-{self.kind}-{slot.id}")
        self.slots.append(slot)
        return slot

    def replace(self, slot: WorkerSlot) -> WorkerSlot:
        if slot in self.slots:
            self.slots.remove(slot)
        return self.spawn()

    async def remove_one(self) -> None:
        """Stop one worker after its current job, an idle one if there is one."""
        live = [slot for slot in self.slots if not slot.stopping]
        idle = [slot for slot in live if slot.busy_since is None]
        slot = (idle or live)[-1]
        slot.stopping = True
        self.wake.wake()
        if slot.task is not None:
            await asyncio.wait([slot.task])
        if slot in self.slots:
            self.slots.remove(slot)

    async def stop_all(self, timeout: float, hurry: asyncio.Event | None = None) -> int:
        """Let every worker finish its job, up to ``timeout`` or until
        ``hurry`` is set; cancel the rest (their jobs whose handler ended
        are in ``stopped_jobs``). Return how many ran at the deadline."""
        self.stopping = True
        for slot in self.slots:
            slot.stopping = True
        self.wake.wake()
        tasks = [slot.task for slot in self.slots if slot.task is not None]
        # A held outcome waits for a handler that still runs: as a worker's does.
        tasks += self.overruns.held
        if not tasks:
            return 0
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(asyncio.wait(tasks))]
        if hurry is not None:
            waits.append(asyncio.ensure_future(hurry.wait()))
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        return len(pending)

    async def _run(self, slot: WorkerSlot) -> None:
        try:
            await self._loop(slot)
        except Exception as exc:  # the supervisor replaces the worker
            slot.crash = exc
            logger.exception("worker %d crashed", slot.id, extra={"action": "worker_crash"})

    async def _loop(self, slot: WorkerSlot) -> None:
        while not (slot.stopping or self.stopping):
            slot.touch()
            seen = self.wake.generation
            try:
                job = await self.claimer.claim()
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
                slot.idle = True
                try:
                    await self.wake.wait(since=seen)
                finally:
                    slot.idle = False
                continue
            slot.current_job, slot.current_claim = job.id, (job.id, job.attempts)
            slot.busy_since, slot.reported_slow = time.monotonic(), False
            slot.lease_lost, slot.cancellable = False, self.executor.is_async(job)
            slot.cancel_asked = False
            run = self._run_traced(job) if self.executor.traced else self.executor.run(job)
            slot.run_task = asyncio.create_task(run)
            if events.JobStarted in events.listening:
                events.emit(
                    events.JobStarted(
                        job.id,
                        job.type_name,
                        job.attempt,
                        waited=time.time() - job.run_at_ms / 1000,
                        worker=slot.id,
                        server_id=self.owner,
                    )
                )
            try:
                try:
                    outcome = await slot.run_task
                except asyncio.CancelledError:
                    if slot.lease_lost:
                        continue  # the lease is gone: the job is not this worker's now
                    if not (slot.cancel_asked and _not_cancelled_itself()):
                        # This worker itself is being stopped. An async handler
                        # that ended on its cancellation left nothing running:
                        # its job can be given back. A sync one goes on in its
                        # thread, so its job waits for its lease.
                        if slot.cancellable and slot.run_task.done():
                            self.stopped_jobs.append(job)
                        raise
                    outcome = CANCELLED  # cancel() stopped the handler
                if slot.cancel_asked and outcome.committed is None:
                    # However the handler ended after the request; an atomic
                    # success that committed first stands.
                    outcome = CANCELLED
                ran = Ran(time.monotonic() - slot.busy_since, slot.id, self.queue)
                await self._outcome_stored(slot)
                if self.wake_when_stored:
                    slot.finishing = self._store_keyed(job, outcome, ran)
                else:
                    slot.finishing = self.completer.store_outcome(job, outcome, ran)
            finally:
                slot.current_job, slot.current_claim = None, None
                slot.busy_since, slot.run_task = None, None
            self.processed += 1
        await self._outcome_stored(slot)

    def _wake_one(self, _: object) -> None:
        self.wake.wake(1)

    def _store_keyed(
        self, job: ClaimedJob, outcome: Outcome, ran: Ran
    ) -> asyncio.Future[None] | None:
        """Store an outcome of a queue whose claims keep concurrency keys,
        then wake one of its workers: the key may have a free slot. A keyed
        job past its timeout whose sync handler still runs keeps its slot
        until the thread returns (worker/overruns.py)."""
        if outcome.thread is not None and self.overruns.keyed(job):
            self.overruns.hold(job, outcome, ran)
            return None
        finishing = self.completer.store_outcome(job, outcome, ran)
        finishing.add_done_callback(self._wake_one)
        return finishing

    async def _run_traced(self, job: ClaimedJob) -> Outcome:
        """Run ``job`` inside its span, continuing the span that enqueued it."""
        store, pool = self.completer.store, self.completer.pool
        try:
            context = await store.run(pool, lambda d, c: d.hot.trace_context(c, job_id=job.id))
        except Exception as exc:  # noqa: BLE001  the run matters more than its trace
            logger.debug("could not read the trace context of job %s: %s", job.id, exc)
            context = None
        with tracing.job_span(
            job_id=job.id, job_type=job.type_name, attempt=job.attempt, context=context
        ) as span:
            outcome = await self.executor.run(job)
            tracing.mark_outcome(span, outcome.kind, outcome.exc)
            return outcome

    async def run_backstop(self) -> None:
        """Wake every idle worker once a poll interval in which nothing else
        did, so a commit no notification told of (a lost LISTEN connection)
        is found within one interval; one shared claim per quiet interval."""
        while True:
            seen = self.wake.generation
            await asyncio.sleep(self.poll_interval)
            if self.wake.generation == seen:
                self.wake.wake()

    @staticmethod
    async def _outcome_stored(slot: WorkerSlot) -> None:
        if slot.finishing is not None:
            if not slot.finishing.done():
                await asyncio.shield(slot.finishing)
            slot.finishing = None

    def cancel_handler_of(self, claim: Claim) -> None:
        """cancel() asked the job of ``claim`` to stop: cancel its async
        handler, or tell its sync one (``ctx.cancel_requested``); the attempt
        ends cancelled once the handler has returned."""
        for slot in self.slots:
            if slot.current_claim != claim or slot.lease_lost or slot.cancel_asked:
                continue
            slot.cancel_asked = True
            logger.info(
                "job %s attempt %d was asked to stop (cancel); %s",
                claim[0],
                claim[1],
                "cancelling its handler" if slot.cancellable else "its sync handler is told",
                extra={"action": "job_cancel_requested", "job_id": claim[0]},
            )
            self.executor.request_cancel(claim)
            if slot.cancellable and slot.run_task is not None:
                slot.run_task.cancel()

    def stop_handler_of(self, claim: Claim, why: str) -> None:
        """Stop the handler running ``claim``, if one still runs; its outcome
        is never stored."""
        for slot in self.slots:
            if slot.current_claim != claim or slot.lease_lost:
                continue
            if slot.run_task is None or slot.run_task.done():
                continue  # finished meanwhile: the fence decides
            self._stop(slot, claim, why)

    def _stop(self, slot: WorkerSlot, claim: Claim, why: str) -> None:
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
            # that never returns hold this worker for good (docs/project/chaos.md).
            logger.warning(
                "abandoned sync handler of job %s attempt %d: %s; it goes on in its "
                "thread (ctx.cancel_requested is set), its outcome will be discarded, "
                "and worker %d moves on",
                job_id,
                attempt,
                why,
                slot.id,
                extra={"action": "handler_abandoned", "job_id": job_id},
            )
        slot.lease_lost = True
        if slot.run_task is not None:
            slot.run_task.cancel()
        if events.active:
            events.emit(
                events.LeaseLost(job_id, attempt, why=why, worker=slot.id, server_id=self.owner)
            )


class WorkerPools:
    """The server's pools (the plain queues' and the partition one), in the
    order they were added: the lease book's ``ClaimHolders``, told of claims
    given up or asked to cancel; the supervisor watches their slots."""

    def __init__(self) -> None:
        self.all: list[WorkerPool] = []

    def add(self, pool: WorkerPool) -> WorkerPool:
        self.all.append(pool)
        return pool

    @property
    def slots(self) -> list[WorkerSlot]:
        return [slot for pool in self.all for slot in pool.slots]

    @property
    def processed(self) -> int:
        return sum(pool.processed for pool in self.all)

    def replace(self, slot: WorkerSlot) -> WorkerSlot:
        pool = next(pool for pool in self.all if slot in pool.slots)
        return pool.replace(slot)

    def given_up(self, claim: Claim, why: str) -> None:
        """Drop ``claim`` if it is a spare, and stop its handler if one runs."""
        for pool in self.all:
            pool.claimer.drop(claim)
        for pool in self.all:
            pool.stop_handler_of(claim, why)

    def cancel_requested(self, claim: Claim) -> None:
        for pool in self.all:
            pool.cancel_handler_of(claim)
