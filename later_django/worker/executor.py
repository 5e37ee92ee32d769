"""Runs one claimed job (handler, payload, call) and classifies the result
as an Outcome. It stores nothing but an atomic job's success, which commits
in its handler's own transaction (worker/atomic.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Literal

from later_django import codec, registry
from later_django.context import JobContext
from later_django.db.rows import TaskAttemptEnd
from later_django.exceptions import JobTimeout, Snooze
from later_django.ids import JobId
from later_django.retry import RetryPolicy, default_policy
from later_django.threaded_store import call_sync
from later_django.types import ClaimedJob
from later_django.worker.atomic import AtomicRunner, Committed
from later_django.worker.handler_threads import HandlerThreads

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 8000


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What to store for a finished attempt."""

    kind: Literal["succeeded", "retry", "failed", "snoozed", "cancelled"]
    error: str | None = None
    # How long a retry or a snooze waits, from the database's now when it is stored.
    delay_ms: int | None = None
    # A policy resolved by a callable after the first failure, to store.
    resolved_policy: str | None = None
    # The handler's exception, for the log only (its text is in ``error``).
    exc: BaseException | None = None
    # An atomic job's success, written in its handler's transaction: True
    # when it committed, False when the claim's fence no longer held and it
    # rolled back; None for every other outcome, which the completer stores.
    committed: bool | None = None
    # The continuations that committed success released.
    released: int = 0
    # A Django Tasks attempt's end, written with the outcome when its fence holds.
    attempt_end: TaskAttemptEnd | None = None
    # The call of a sync handler that ran past its timeout, still running in
    # its thread when the attempt failed: done once the handler returns.
    thread: Future[Any] | None = None


SUCCEEDED = Outcome(kind="succeeded")
# cancel() asked a running job to stop and its handler ended.
CANCELLED = Outcome(kind="cancelled")


def describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    head = f"{type(exc).__name__}: {exc}"
    body = f"{head}\n\n{text}"
    return body if len(body) <= MAX_ERROR_CHARS else body[: MAX_ERROR_CHARS - 3] + "..."


class Executor:
    """Runs handlers: async ones on the loop, sync ones in ``handler_pool``;
    atomic ones through ``atomic``, in their thread's transaction."""

    def __init__(
        self,
        handler_pool: HandlerThreads,
        app: Any = None,
        *,
        atomic: AtomicRunner,
        traced: bool = False,
    ) -> None:
        self.handler_pool = handler_pool
        self.app = app
        self.atomic = atomic
        # With tracing, a sync handler's thread runs in a copy of the
        # caller's context, so the job's span is current there too.
        self.traced = traced
        # The context of each attempt running here, to tell it of a cancel.
        self._running: dict[tuple[str, int], JobContext] = {}

    def request_cancel(self, claim: tuple[str, int]) -> None:
        """Set ``ctx.cancel_requested`` of the attempt ``claim`` runs here."""
        ctx = self._running.get(claim)
        if ctx is not None:
            ctx.cancel_requested.set()

    @staticmethod
    def is_async(job: ClaimedJob) -> bool:
        handler = registry.handler_by_name(job.type_name)
        return handler is not None and handler.is_async

    async def run(self, job: ClaimedJob) -> Outcome:
        handler = registry.handler_by_name(job.type_name)
        if handler is None:
            return outcome_without_handler(job)
        try:
            payload = codec.decode(job.payload, handler.payload_type)
        except codec.PayloadDecodeError as exc:
            return outcome_of_bad_payload(job, exc)
        ctx = JobContext(job_id=JobId(job.id), attempt=job.attempt, app=self.app)
        limit_ms = job.timeout_ms or handler.timeout_ms
        claim = (job.id, job.attempts)
        self._running[claim] = ctx
        try:
            if handler.is_async:
                if limit_ms is None:
                    await handler.func(ctx, payload)
                else:
                    await _run_async_within(limit_ms, handler, ctx, payload)
            else:
                call: Any = call_sync
                if self.traced:
                    call = functools.partial(contextvars.copy_context().run, call_sync)  # type: ignore[arg-type]
                func = handler.func
                if handler.atomic:
                    func = functools.partial(self.atomic.run, job, handler.func)
                ran, started = self.handler_pool.run_on_loop(call, func, ctx, payload)
                if limit_ms is None:
                    result = await ran
                else:
                    try:
                        result = await _wait_sync_within(limit_ms, ran, started, ctx)
                    except JobTimeout as exc:
                        outcome = outcome_of_error(job, handler, ctx, payload, exc)
                        outcome = with_attempt_end(outcome, ctx)
                        # A thread still running goes with it (worker/overruns.py
                        # holds a keyed job's outcome until it returns).
                        return outcome if started.done() else replace(outcome, thread=started)
                if handler.atomic:
                    return committed_outcome(result)
        except asyncio.CancelledError:
            # The worker stopped the attempt (its lease lost or no longer
            # confirmed, the shutdown deadline passed): a sync handler's
            # thread goes on, and is told so; an atomic one rolls back
            # rather than commit an attempt nobody waits for.
            ctx.cancel_requested.set()
            raise
        except BaseException as exc:  # noqa: BLE001  even sys.exit() in a handler is its failure
            return with_attempt_end(outcome_of_error(job, handler, ctx, payload, exc), ctx)
        finally:
            del self._running[claim]
        return with_attempt_end(SUCCEEDED, ctx)


async def _run_async_within(
    limit_ms: int, handler: registry.Handler, ctx: JobContext, payload: object
) -> None:
    """Run an async handler; past ``limit_ms`` it is cancelled and JobTimeout
    raised. A TimeoutError of the handler's own stays its own."""
    try:
        async with asyncio.timeout(limit_ms / 1000) as scope:
            await handler.func(ctx, payload)
    except TimeoutError:
        if not scope.expired():
            raise
        ctx.cancel_requested.set()
        raise _timed_out(limit_ms) from None


async def _wait_sync_within(
    limit_ms: int, ran: asyncio.Future[Any], started: Future[Any], ctx: JobContext
) -> Any:
    """Wait for a sync handler's thread and return its result. Past
    ``limit_ms`` raise JobTimeout: the thread cannot be stopped, so it is
    told (``ctx.cancel_requested``) and abandoned, its outcome never stored;
    a handler still waiting for a thread then never starts."""
    try:
        return await asyncio.wait_for(ran, limit_ms / 1000)
    except TimeoutError:
        if not ran.cancelled():
            raise  # the handler's own TimeoutError
        if started.done() and not started.cancelled():
            # It ended in time; its outcome was on its way to the loop.
            return started.result()
        ctx.cancel_requested.set()
        if started.cancelled():
            action = "handler_not_started"
            message = (
                "job %s attempt %d waited its whole timeout of %d ms for a handler "
                "thread (the worker process was busy) and did not start"
            )
        else:
            action = "handler_abandoned"
            message = (
                "abandoned sync handler of job %s attempt %d: it ran past its timeout of "
                "%d ms; it goes on in its thread (ctx.cancel_requested is set), its "
                "outcome will be discarded, and its worker moves on"
            )
        logger.warning(
            message,
            ctx.job_id,
            ctx.attempt,
            limit_ms,
            extra={"action": action, "job_id": ctx.job_id},
        )
        raise _timed_out(limit_ms) from None


def _timed_out(limit_ms: int) -> JobTimeout:
    return JobTimeout(f"the attempt ran past the job's timeout of {limit_ms / 1000:g} s")


# What a run that did not succeed means, for the executor and drain() alike,
# so a job fails and retries the same way under both.


def with_attempt_end(outcome: Outcome, ctx: JobContext) -> Outcome:
    """``outcome`` with the attempt's end its handler handed over, if any
    (a Django Tasks job's: later_django.tasks.runner)."""
    end = ctx._attempt_end
    return outcome if end is None else replace(outcome, attempt_end=end)


def committed_outcome(committed: Committed) -> Outcome:
    """An atomic job's success, stored (or refused by its fence) with its
    handler's writes."""
    return Outcome(kind="succeeded", committed=committed.stored, released=committed.released)


def outcome_without_handler(job: ClaimedJob) -> Outcome:
    """A job whose type has no handler here: retried by its policy, so a
    rolling deploy that adds the handler heals."""
    error = f"no handler for {job.type_name}"
    return _after_failure(job, error, _stored_policy(job) or default_policy())


def outcome_of_bad_payload(job: ClaimedJob, exc: codec.PayloadDecodeError) -> Outcome:
    """A payload that does not decode fails its job at once."""
    return Outcome(kind="failed", error=f"{exc} (type {job.type_name})")


def outcome_of_error(
    job: ClaimedJob,
    handler: registry.Handler,
    ctx: JobContext,
    payload: object,
    exc: BaseException,
) -> Outcome:
    """A handler that raised ``exc``: a retry or a failure, by the job's
    policy; Snooze: the job runs again after its delay, the attempt not
    counted."""
    if isinstance(exc, Snooze):
        return Outcome(kind="snoozed", delay_ms=exc.delay_ms)
    policy, resolved = _policy(job, handler, ctx, payload)
    return _after_failure(job, describe(exc), policy, resolved, exc)


def _policy(
    job: ClaimedJob, handler: registry.Handler, ctx: JobContext, payload: object
) -> tuple[RetryPolicy, str | None]:
    stored = _stored_policy(job)
    if stored is not None:
        return stored, None
    if isinstance(handler.retry, RetryPolicy):
        return handler.retry, None
    if handler.retry is not None:
        try:
            policy = handler.retry(ctx, payload)
            if not isinstance(policy, RetryPolicy):
                raise TypeError(f"returned {type(policy).__name__}, not a RetryPolicy")
        except Exception:
            logger.exception(
                "retry policy callable of %s failed; using the default policy",
                job.type_name,
                extra={"action": "retry_policy_error", "job_id": job.id},
            )
            return default_policy(), None
        return policy, policy.to_json()
    return default_policy(), None


def _after_failure(
    job: ClaimedJob,
    error: str,
    policy: RetryPolicy,
    resolved: str | None = None,
    exc: BaseException | None = None,
) -> Outcome:
    delay = policy.next_delay(job.attempt)
    if delay is None:
        return Outcome(kind="failed", error=error, exc=exc)
    return Outcome(
        kind="retry",
        error=error,
        delay_ms=int(delay.total_seconds() * 1000),
        resolved_policy=resolved,
        exc=exc,
    )


def _stored_policy(job: ClaimedJob) -> RetryPolicy | None:
    if not job.retry_policy:
        return None
    try:
        return RetryPolicy.from_json(job.retry_policy)
    except (ValueError, KeyError, TypeError):
        logger.warning("job %s has an unreadable retry policy; using the default", job.id)
        return None
