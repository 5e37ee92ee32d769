"""Storing what each job did: successes in shared batches on a connection of
their own, failures and retries one statement each on a thread pool.

Every write is fenced by the claim (job id, attempt): an outcome whose lease
was taken over is discarded. Only transient errors are retried, and never
past the lease's deadline; then the claim is let go, so its lease expires and
the stuck-job recovery runs the job again (on this server or another).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from later_django import events
from later_django.db.errors import is_transient
from later_django.db.rows import HeadSuccesses, TaskAttemptEnd
from later_django.db.sessions import WorkerSessions
from later_django.events import OutcomeKind
from later_django.maintenance.runner import Maintenance
from later_django.types import ClaimedJob
from later_django.worker.batching import Coalescer
from later_django.worker.claimer import ClaimSetup
from later_django.worker.executor import Outcome
from later_django.worker.lease_book import EXPIRED, Claim
from later_django.worker.outcome_writes import store_failure, store_partition_outcome
from later_django.worker.partitions import PartitionClaimer
from later_django.worker.status import OutcomeCounts

logger = logging.getLogger(__name__)


class Ran(NamedTuple):
    """How a handler ran: for how long, and on which worker of this server."""

    seconds: float
    worker: int
    queue: str = "default"


COMPLETE_BATCH = 256  # successes stored by one statement at most
FINISH_RETRY_MAX = 5.0  # cap, in seconds, of the backoff between finish attempts
DISCARDED = "its outcome was discarded: another server had taken the job over"
CANCEL_GRACE = 2.0  # seconds stores still running after an abandon get before cancellation
# The stage each outcome leaves its job in.
OUTCOME_STAGES = {
    "succeeded": "success",
    "retry": "requeued",
    "failed": "failed",
    "snoozed": "delayed",
    "cancelled": "cancelled",
}


class Completer:
    def __init__(
        self,
        setup: ClaimSetup,
        *,
        retention_ms: int,
        pool: ThreadPoolExecutor,
        wake: Callable[[int], None],
        maintenance: Maintenance,
        lanes: PartitionClaimer,
        outcomes: OutcomeCounts,
    ) -> None:
        self.owner, self.store, self.leases = setup.owner, setup.store, setup.leases
        self.retention_ms = retention_ms
        self.pool = pool
        self.wake = wake
        self.maintenance = maintenance
        self.sessions = WorkerSessions(setup.alias, prepare=setup.prepare)
        # Partition heads' ends: their partition may run its next head.
        self.lanes = lanes
        self.outcomes = outcomes  # stored since the last status line
        # Claims whose handler ended and whose outcome is being stored.
        self.unstored: dict[Claim, ClaimedJob] = {}
        self._finishing: set[asyncio.Future[None]] = set()
        self._completions: Coalescer[Claim, bool] = Coalescer(
            self._complete_batch, max_batch=COMPLETE_BATCH
        )
        # The ends of Django Tasks attempts whose success waits for a shared
        # completion: written by it, in its statement.
        self._attempt_ends: dict[Claim, TaskAttemptEnd] = {}
        # Partition heads' successes, shared as plain ones are; each may claim
        # its partition's next head in the same statement (``lanes.wants_next``).
        self._head_successes: Coalescer[tuple[ClaimedJob, bool], bool] = Coalescer(
            self._complete_heads, max_batch=COMPLETE_BATCH
        )

    def store_outcome(self, job: ClaimedJob, outcome: Outcome, ran: Ran) -> asyncio.Future[None]:
        """Store ``outcome`` of a handler that ran as ``ran`` says, apart from
        the worker (a cancelled worker must still record what its job did);
        the future is done once it is stored."""
        if outcome.committed is not None:
            return self._committed(job, outcome, ran)
        claim = (job.id, job.attempts)
        self.unstored[claim] = job
        if outcome.kind != "succeeded" or job.lane is not None:
            return self._finish_in_task(job, outcome, ran)
        if outcome.attempt_end is not None:
            self._attempt_ends[claim] = outcome.attempt_end
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
                retry = self._finish_in_task(job, outcome, ran, unsure=True)
                retry.add_done_callback(lambda _: resolve(finished))
                return
            self.unstored.pop(claim, None)
            self.leases.release(claim)
            self._stored(job, outcome, "succeeded" if stored.result() else None, ran)
            resolve(finished)

        self._completions.submit_nowait(claim).add_done_callback(on_stored)
        return finished

    def _committed(self, job: ClaimedJob, outcome: Outcome, ran: Ran) -> asyncio.Future[None]:
        """An atomic job's success, committed (or refused by its fence) in its
        handler's transaction: what follows a store is all that is left."""
        self.leases.release((job.id, job.attempts))
        if outcome.released:
            self.wake(outcome.released)
        self._stored(job, outcome, outcome.kind if outcome.committed else None, ran)
        if job.lane is not None:
            self.lanes.done(job)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _complete_batch(self, requests: list[Claim]) -> list[bool]:
        ends = self._attempt_ends
        tasks = [(claim, ends[claim]) for claim in requests if claim in ends] if ends else []
        completion = await self.sessions.complete_many(
            owner=self.owner,
            jobs=requests,
            retention_ms=self.retention_ms,
            results=[end for _, end in tasks],
        )
        for claim, _ in tasks:
            # Written, or refused with its claim: either way never needed again.
            del ends[claim]
        if completion.released:
            # Continuations just became ready: this server's idle workers need
            # not wait for a poll (SQLite) to find them.
            self.wake(completion.released)
        completed = set(completion.done_ids)
        return [job_id in completed for job_id, _ in requests]

    async def _complete_heads(self, requests: list[tuple[ClaimedJob, bool]]) -> list[bool]:
        sent = asyncio.get_running_loop().time()
        stored = await self.sessions.partition_complete_many(
            HeadSuccesses(
                owner=self.owner,
                heads=[job for job, _ in requests],
                chain=[chain for _, chain in requests],
                retention_ms=self.retention_ms,
                job_lease_ms=self.leases.lease_ms,
            )
        )
        # Held from the moment the statement was sent, as any claim.
        self.leases.hold([(head.id, head.attempts) for head in stored.next_heads], sent)
        for head in stored.next_heads:
            self.lanes.next_head(head)
        if stored.released:
            self.wake(stored.released)
        completed = set(stored.done_ids)
        return [job.id in completed for job, _ in requests]

    def _finish_in_task(
        self, job: ClaimedJob, outcome: Outcome, ran: Ran, *, unsure: bool = False
    ) -> asyncio.Future[None]:
        claim = (job.id, job.attempts)
        task = asyncio.ensure_future(self._finish(job, outcome, ran, unsure=unsure))
        self._finishing.add(task)

        def done(_: object) -> None:
            self._finishing.discard(task)
            self.unstored.pop(claim, None)
            self.leases.release(claim)
            if job.lane is not None:
                self.lanes.done(job)

        task.add_done_callback(done)
        return task

    async def _finish(
        self, job: ClaimedJob, outcome: Outcome, ran: Ran, *, unsure: bool = False
    ) -> None:
        """Store ``outcome``, retrying transient errors while the lease holds.

        ``unsure``: an earlier store of it failed in a way that may have
        committed (an error or an abandoned call); its fence then no longer
        holds, and what the database stored tells whether it did."""
        claim = (job.id, job.attempts)
        loop = asyncio.get_running_loop()
        delay = 0.05
        stored: OutcomeKind | None
        while True:
            try:
                if job.lane is not None and outcome.kind == "succeeded":
                    # On the completions' own connection, shared as plain
                    # successes. A retried store claims no next head: one an
                    # earlier, unconfirmed try claimed is recovered once its
                    # lease expires, as an abandoned claim's jobs are.
                    chain = not unsure and self.lanes.wants_next(job)
                    done = await self._head_successes.submit((job, chain))
                    stored = "succeeded" if done else None
                elif outcome.kind == "succeeded":
                    stored = "succeeded" if await self._completions.submit(claim) else None
                else:
                    write = functools.partial(
                        store_failure if job.lane is None else store_partition_outcome,
                        job=job,
                        outcome=outcome,
                        owner=self.owner,
                        retention_ms=self.retention_ms,
                    )
                    stored = await self.store.run(self.pool, write, atomic=True)
                break
            except Exception as exc:  # noqa: BLE001  sorted below
                if not is_transient(exc):
                    self._give_up(job, exc, "the error is not transient")
                    return
                until = self.leases.until(claim)
                if until is None or loop.time() + delay >= until:
                    self._give_up(job, exc, EXPIRED)
                    return
                self._log_finish_error(job, exc)
                unsure = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, FINISH_RETRY_MAX)
        if not stored and unsure:
            stored = await self._stored_before(job, outcome)
        self._stored(job, outcome, stored, ran)
        if stored in ("retry", "snoozed") and outcome.delay_ms is not None:
            self.maintenance.promote_after(outcome.delay_ms)

    async def _stored_before(self, job: ClaimedJob, outcome: Outcome) -> OutcomeKind | None:
        """What an earlier, unconfirmed store of ``outcome`` committed, if it
        did: the job in the stage that outcome stores with its error (the
        rescue writes its own error), or cancelled, a cancel request having
        turned a failure into that."""
        claim = (job.id, job.attempts)
        try:
            left = await self.store.run(self.pool, lambda d, c: d.hot.stage_after(c, claim))
        except Exception as exc:  # noqa: BLE001  reported as discarded, as before
            logger.warning("could not read what job %s stored: %s", job.id, exc)
            return None
        if left is None:
            return None
        if left.stage == "cancelled" and outcome.kind != "succeeded":
            return "cancelled"
        if left.stage != OUTCOME_STAGES[outcome.kind]:
            return None
        if outcome.kind in ("retry", "failed") and left.last_error != outcome.error:
            return None
        return outcome.kind

    def _give_up(self, job: ClaimedJob, exc: BaseException, why: str) -> None:
        claim = (job.id, job.attempts)
        self.leases.release(claim)
        self.unstored.pop(claim, None)
        self._attempt_ends.pop(claim, None)
        logger.error(
            "gave up storing the outcome of job %s attempt %d (%s): %s; its lease "
            "expires and the stuck-job recovery runs it again",
            job.id,
            job.attempt,
            why,
            exc,
            extra={"action": "finish_abandoned", "job_id": job.id},
        )

    @staticmethod
    def _log_finish_error(job: ClaimedJob, error: object) -> None:
        logger.error(
            "could not store the outcome of job %s: %s; retrying",
            job.id,
            error,
            extra={"action": "finish_error", "job_id": job.id},
        )

    def _stored(
        self, job: ClaimedJob, outcome: Outcome, stored: OutcomeKind | None, ran: Ran
    ) -> None:
        """Count, log and tell subscribers what became of an outcome:
        ``stored`` is the kind of outcome the database holds now (a retry
        that a cancel request turned into "cancelled", say), None if the
        lease was taken over."""
        self._log_outcome(job, outcome, stored)
        if not events.active:
            return
        if stored:
            now = time.time()
            events.emit(
                events.JobFinished(
                    job.id,
                    job.type_name,
                    job.attempt,
                    stored,
                    ran.seconds,
                    now - job.created_ms / 1000,
                    now - ran.seconds - job.run_at_ms / 1000,
                    ran.worker,
                    self.owner,
                    job.lane is not None,
                    ran.queue,
                )
            )
        else:
            events.emit(
                events.LeaseLost(
                    job.id, job.attempts, why=DISCARDED, worker=ran.worker, server_id=self.owner
                )
            )

    def _log_outcome(self, job: ClaimedJob, outcome: Outcome, stored: OutcomeKind | None) -> None:
        extra = {"action": f"job_{stored}", "job_id": job.id, "job_type": job.type_name}
        if stored is None:
            logger.warning(
                "job %s (%s) finished after its lease was taken over; its outcome was discarded%s",
                job.id,
                job.type_name,
                " and its writes rolled back" if outcome.committed is False else "",
                extra={**extra, "action": "lease_lost"},
            )
            return
        self.outcomes.add(stored)
        if stored == "succeeded":
            logger.debug("job %s (%s) succeeded", job.id, job.type_name, extra=extra)
            return
        error = _first_line(outcome.error)
        level, message, args = {
            "failed": (logging.ERROR, "failed on attempt %d: %s", (job.attempt, error)),
            "cancelled": (logging.INFO, "cancelled on attempt %d", (job.attempt,)),
            "snoozed": (logging.INFO, "snoozed for %d ms", (outcome.delay_ms or 0,)),
            "retry": (logging.WARNING, "attempt %d failed, retrying: %s", (job.attempt, error)),
        }[stored]
        exc_info = outcome.exc if stored == "failed" else None
        logger.log(
            level,
            "job %s (%s) " + message,
            job.id,
            job.type_name,
            *args,
            extra=extra,
            exc_info=exc_info,
        )

    # -- shutdown ---------------------------------------------------------------
    def hung_since(self) -> float | None:
        """When the shared completion now in the database started, if one is."""
        return self._completions.flush_started

    def reset(self) -> None:
        """Abandon a shared completion that never returned."""
        self._completions.reset()

    async def wait(self, timeout: float) -> set[asyncio.Future[None]]:
        """Wait up to ``timeout`` for the outcomes being stored; return those left."""
        pending = {future for future in self._finishing if not future.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout)
        return pending

    async def abandon(self, pending: set[asyncio.Future[None]]) -> None:
        """Give up the stores in ``pending``: their leases expire and the
        stuck-job recovery runs those jobs again. The session closes first, so
        an abandoned store can never reconnect and write after shutdown."""
        await self.sessions.close()
        self._completions.reset()
        for future in pending:
            future.cancel()
        # Stores retried after the reset fail at once on the closed session;
        # whatever still runs after a grace period is cancelled, so no store
        # outlives shutdown.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_GRACE
        while left := {future for future in self._finishing if not future.done()}:
            remaining = deadline - loop.time()
            if remaining <= 0:
                for future in left:
                    future.cancel()
                await asyncio.wait(left, timeout=1.0)
                return
            await asyncio.wait(left, timeout=min(remaining, 0.1))

    async def close(self) -> None:
        await self.sessions.close()


def resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0]
