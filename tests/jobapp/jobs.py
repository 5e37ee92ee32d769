"""Payload types and handlers the test suite enqueues and workers run."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

from later_django import JobContext, RetryPolicy, Snooze, cancel, job


def _record(kind: str, ctx: JobContext, tag: str = "") -> None:
    """Append one line per handler run to a file the test reads back."""
    path = os.environ.get("LATER_TEST_RECORD")
    if path:
        # The real wall clock: a worker under LATER_TEST_CLOCK_SKEW has a
        # wrong time.time() (tests/settings.py), and records of processes
        # are compared with each other.
        start = time.clock_gettime(time.CLOCK_REALTIME)
        with open(path, "a") as fh:
            fh.write(f"{kind} {ctx.job_id} {ctx.attempt} {os.getpid()} {start:.6f} {tag}\n")


@dataclass
class Noop:
    n: int = 0


@job
def run_noop(ctx: JobContext, payload: Noop) -> None:
    _record("noop", ctx, str(payload.n))


@dataclass
class AsyncNoop:
    n: int = 0


@job
async def run_async_noop(ctx: JobContext, payload: AsyncNoop) -> None:
    _record("async", ctx, str(payload.n))


@dataclass
class Sleep:
    seconds: float
    n: int = 0


@job(retry=RetryPolicy.fixed(3, timedelta(milliseconds=100)))
def run_sleep(ctx: JobContext, payload: Sleep) -> None:
    _record("sleep-start", ctx, str(payload.n))
    time.sleep(payload.seconds)
    _record("sleep-end", ctx, str(payload.n))


@dataclass
class AsyncSleep:
    seconds: float
    n: int = 0


@job
async def run_async_sleep(ctx: JobContext, payload: AsyncSleep) -> None:
    _record("asleep-start", ctx, str(payload.n))
    await asyncio.sleep(payload.seconds)
    _record("asleep-end", ctx, str(payload.n))


@dataclass
class AsyncHold:
    """Holds its worker ``seconds`` on its first attempt and ``then`` on later
    ones; a cancellation is recorded."""

    seconds: float
    then: float = 0.0
    n: int = 0


@job(retry=RetryPolicy.fixed(5, timedelta(milliseconds=100)))
async def run_async_hold(ctx: JobContext, payload: AsyncHold) -> None:
    _record("hold-start", ctx, str(payload.n))
    try:
        await asyncio.sleep(payload.seconds if ctx.attempt == 1 else payload.then)
    except asyncio.CancelledError:
        _record("hold-cancelled", ctx, str(payload.n))
        raise
    _record("hold-end", ctx, str(payload.n))


@dataclass
class Flaky:
    """Fails until attempt ``succeed_on`` (0: always fails)."""

    succeed_on: int = 0
    message: str = "flaky failure"


@job(retry=RetryPolicy.fixed(2, timedelta(milliseconds=50)))
def run_flaky(ctx: JobContext, payload: Flaky) -> None:
    _record("flaky", ctx)
    if payload.succeed_on == 0 or ctx.attempt < payload.succeed_on:
        raise RuntimeError(f"{payload.message} (attempt {ctx.attempt})")


@dataclass
class NoRetry:
    pass


@job(retry=RetryPolicy.no_retries())
def run_no_retry(ctx: JobContext, payload: NoRetry) -> None:
    _record("noretry", ctx)
    raise ValueError("refused once and for all")


@dataclass
class Gate:
    """Fails, with no retry, while the file ``path`` does not exist: a job
    that succeeds once the test opens the gate and retries it."""

    path: str


@job(retry=RetryPolicy.no_retries())
def run_gate(ctx: JobContext, payload: Gate) -> None:
    _record("gate", ctx)
    if not os.path.exists(payload.path):
        raise RuntimeError(f"the gate is closed: {payload.path} does not exist")


@dataclass
class Rendezvous:
    """Ends once ``parties`` jobs of the folder ``path`` have started: only
    if that many sync handlers run at once. Fails after 10 s."""

    path: str
    parties: int


@job(retry=RetryPolicy.no_retries())
def run_rendezvous(ctx: JobContext, payload: Rendezvous) -> None:
    _record("rendezvous-start", ctx)
    with open(os.path.join(payload.path, str(ctx.job_id)), "w"):
        pass
    deadline = time.monotonic() + 10
    while len(os.listdir(payload.path)) < payload.parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(os.listdir(payload.path))} of {payload.parties} came")
        time.sleep(0.005)


@dataclass
class CallablePolicy:
    retries: int = 1


def _policy_from_payload(ctx: JobContext, payload: CallablePolicy) -> RetryPolicy:
    return RetryPolicy.fixed(payload.retries, timedelta(milliseconds=50))


@job(retry=_policy_from_payload)
def run_callable_policy(ctx: JobContext, payload: CallablePolicy) -> None:
    _record("callable", ctx)
    raise RuntimeError("always fails")


@dataclass
class DefaultPolicy:
    pass


@job
def run_default_policy(ctx: JobContext, payload: DefaultPolicy) -> None:
    _record("default", ctx)
    raise RuntimeError("fails under the default policy")


@dataclass
class Chain:
    """Enqueues a Noop continuation of itself from inside the handler."""

    n: int = 0


@job
def run_chain(ctx: JobContext, payload: Chain) -> None:
    _record("chain", ctx)
    ctx.enqueue(Noop(n=payload.n))


@dataclass
class Item:
    name: str
    qty: int


@dataclass
class Order:
    id: int
    items: list[Item] = field(default_factory=list)
    note: str | None = None


@job
def run_order(ctx: JobContext, payload: Order) -> None:
    _record("order", ctx, str(payload.id))


@dataclass
class Snoozy:
    """Snoozes ``times`` times for ``delay_ms``, then succeeds."""

    times: int = 1
    delay_ms: int = 50


@dataclass
class AsyncSnoozy:
    times: int = 1
    delay_ms: int = 50


# How often each job snoozed (the attempt does not tell: snoozes are not
# counted). In-process servers only.
snoozed: dict[str, int] = {}


def _snooze_or_finish(kind: str, ctx: JobContext, times: int, delay_ms: int) -> None:
    _record(kind, ctx)
    done = snoozed.get(ctx.job_id, 0)
    if done < times:
        snoozed[ctx.job_id] = done + 1
        raise Snooze(timedelta(milliseconds=delay_ms))


# No retries: a snooze counted as a failed attempt would fail the job.
@job(retry=RetryPolicy.no_retries())
def run_snoozy(ctx: JobContext, payload: Snoozy) -> None:
    _snooze_or_finish("snoozy", ctx, payload.times, payload.delay_ms)


@job(retry=RetryPolicy.no_retries())
async def run_async_snoozy(ctx: JobContext, payload: AsyncSnoozy) -> None:
    _snooze_or_finish("snoozy", ctx, payload.times, payload.delay_ms)


@dataclass
class Overrun:
    """Sleeps ``seconds`` in a thread, watching ctx.cancel_requested."""

    seconds: float = 2.0


@job(timeout=timedelta(milliseconds=300), retry=RetryPolicy.fixed(1, timedelta(milliseconds=50)))
def run_overrun(ctx: JobContext, payload: Overrun) -> None:
    _record("overrun-start", ctx)
    if ctx.cancel_requested.wait(payload.seconds):
        _record("overrun-told", ctx)


@dataclass
class AsyncOverrun:
    seconds: float = 2.0


@job(timeout=timedelta(milliseconds=300), retry=RetryPolicy.fixed(1, timedelta(milliseconds=50)))
async def run_async_overrun(ctx: JobContext, payload: AsyncOverrun) -> None:
    _record("overrun-start", ctx)
    try:
        await asyncio.sleep(payload.seconds)
    except asyncio.CancelledError:
        _record("overrun-told", ctx)
        raise


@dataclass
class CancelledThen:
    """Calls cancel() on its own job, then ends its attempt as ``then``
    says: "retry" (raises, its policy retries), "snooze" or "fail" (raises,
    no retry): a cancel its worker has not seen yet when it stores that."""

    then: str


def _retried_unless_fail(ctx: JobContext, payload: CancelledThen) -> RetryPolicy:
    if payload.then == "fail":
        return RetryPolicy.no_retries()
    return RetryPolicy.fixed(3, timedelta(seconds=1))


@job(retry=_retried_unless_fail)
def run_cancelled_then(ctx: JobContext, payload: CancelledThen) -> None:
    assert cancel(ctx.job_id), "a running job is asked to stop"
    _record("cancelled-then", ctx, payload.then)
    if payload.then == "snooze":
        raise Snooze(timedelta(seconds=1))
    raise ValueError(f"failed after a cancel ({payload.then})")


@dataclass
class Stoppable:
    """Waits up to ``seconds`` for ctx.cancel_requested, in a thread."""

    seconds: float = 10.0


@job
def run_stoppable(ctx: JobContext, payload: Stoppable) -> None:
    _record("stoppable-start", ctx)
    if ctx.cancel_requested.wait(payload.seconds):
        _record("stoppable-told", ctx)


@dataclass
class AsyncStoppable:
    seconds: float = 10.0


@job
async def run_async_stoppable(ctx: JobContext, payload: AsyncStoppable) -> None:
    _record("stoppable-start", ctx)
    try:
        await asyncio.sleep(payload.seconds)
    except asyncio.CancelledError:
        _record("stoppable-told", ctx)
        raise


@dataclass
class Exits:
    code: int = 3


@job(retry=RetryPolicy.no_retries())
def run_exits(ctx: JobContext, payload: Exits) -> None:
    raise SystemExit(payload.code)


@dataclass
class AsyncExits:
    code: int = 3


@job(retry=RetryPolicy.no_retries())
async def run_async_exits(ctx: JobContext, payload: AsyncExits) -> None:
    raise SystemExit(payload.code)


@dataclass
class Urgent:
    n: int = 0


@job(priority=7)
def run_urgent(ctx: JobContext, payload: Urgent) -> None:
    _record("urgent", ctx, str(payload.n))


def _current_span() -> str:
    """The current OpenTelemetry span as "<trace id>/<span id>" (hex)."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}/{context.span_id:016x}"


@dataclass
class TraceProbe:
    n: int = 0


@job
def run_trace_probe(ctx: JobContext, payload: TraceProbe) -> None:
    _record("trace", ctx, _current_span())


@dataclass
class AsyncTraceProbe:
    n: int = 0


@job
async def run_async_trace_probe(ctx: JobContext, payload: AsyncTraceProbe) -> None:
    _record("trace", ctx, _current_span())


# -- jobs that write to the database (tests/api/test_testing.py) ---------------------


def _notes():  # the LATER database, so a job's writes join a test's transaction there
    from later_django.conf import conf
    from tests.jobapp.models import Note

    return Note.objects.using(conf.database)


@dataclass
class WriteNote:
    """Writes a Note of ``text``; a second one of the same text raises IntegrityError."""

    text: str


@job(retry=RetryPolicy.no_retries())
def run_write_note(ctx: JobContext, payload: WriteNote) -> None:
    _notes().create(text=payload.text, job_id=ctx.job_id, attempt=ctx.attempt)


@dataclass
class AsyncWriteNote:
    text: str


@job
async def run_async_write_note(ctx: JobContext, payload: AsyncWriteNote) -> None:
    await _notes().acreate(text=payload.text, job_id=ctx.job_id, attempt=ctx.attempt)
    # Enqueued through the async twin from the handler, as users write it.
    await ctx.aenqueue(WriteNote(text=f"{payload.text} (after)"))


@dataclass
class NoteThenFail:
    """Writes a Note, then fails: the write stays, as under a worker."""

    text: str


@job(retry=RetryPolicy.no_retries())
def run_note_then_fail(ctx: JobContext, payload: NoteThenFail) -> None:
    _notes().create(text=payload.text, job_id=ctx.job_id, attempt=ctx.attempt)
    raise RuntimeError(f"failed after writing {payload.text!r}")


@dataclass
class RetryAtOnce:
    """Fails until attempt ``succeed_on``; its retries are due at once."""

    text: str
    succeed_on: int


@job(retry=RetryPolicy.fixed(3, timedelta(0)))
def run_retry_at_once(ctx: JobContext, payload: RetryAtOnce) -> None:
    if ctx.attempt < payload.succeed_on:
        raise RuntimeError(f"not yet (attempt {ctx.attempt})")
    _notes().create(text=payload.text, job_id=ctx.job_id, attempt=ctx.attempt)


@dataclass
class Again:
    """Enqueues itself again: a queue that never empties."""

    n: int = 0


@job
def run_again(ctx: JobContext, payload: Again) -> None:
    ctx.enqueue(Again(n=payload.n + 1))


# -- sequential partition mode (topic "ordered", registered by the tests) ---------
@dataclass
class Ordered:
    """A job of topic "ordered": per key, runs must start and end in ``n``
    order, one at a time. ``fail_first`` fails attempt 1 (the retry keeps
    its place); ``seconds`` is how long the handler runs."""

    key: str
    n: int
    seconds: float = 0.0
    fail_first: bool = False

    def partition_key(self) -> str:
        return self.key


@job(topic="ordered", retry=RetryPolicy.fixed(5, timedelta(milliseconds=20)))
async def run_ordered(ctx: JobContext, payload: Ordered) -> None:
    tag = f"{payload.key}:{payload.n}"
    _record("ordered-start", ctx, tag)
    if payload.seconds:
        await asyncio.sleep(payload.seconds)
    if payload.fail_first and ctx.attempt == 1:
        _record("ordered-fail", ctx, tag)
        raise RuntimeError(f"first attempt of {tag} fails")
    _record("ordered-end", ctx, tag)


@dataclass
class OrderedSync:
    """A sync job of topic "ordered" (its handler runs in a thread)."""

    key: str
    n: int
    seconds: float = 0.0

    def partition_key(self) -> str:
        return self.key


@job(topic="ordered")
def run_ordered_sync(ctx: JobContext, payload: OrderedSync) -> None:
    tag = f"{payload.key}:{payload.n}"
    _record("ordered-start", ctx, tag)
    if payload.seconds:
        time.sleep(payload.seconds)
    _record("ordered-end", ctx, tag)


@dataclass
class SlowTick:
    """An occurrence of a sequential recurring job that outlasts its period;
    with ``chain``, it chains a TickChild to itself."""

    seconds: float
    chain: bool = False


@job
def run_slow_tick(ctx: JobContext, payload: SlowTick) -> None:
    _record("tick-start", ctx)
    time.sleep(payload.seconds)
    if payload.chain:
        ctx.enqueue_recurring_continue(ctx.job_id, TickChild(parent=ctx.job_id))
    _record("tick-end", ctx)


@dataclass
class TickChild:
    parent: str


@job
def run_tick_child(ctx: JobContext, payload: TickChild) -> None:
    _record("tick-start", ctx, payload.parent)
    _record("tick-end", ctx, payload.parent)


@dataclass
class Refresh:
    """Unique per account while unfinished (docs/how-to/unique-jobs.md)."""

    account: int
    n: int = 0


@job(unique_key=lambda payload: f"account-{payload.account}")
def run_refresh(ctx: JobContext, payload: Refresh) -> None:
    _record("refresh", ctx, str(payload.n))


@dataclass
class Digest:
    """One per hour-long window, finished ones included."""

    n: int = 0


@job(unique_key="digest", unique_for=timedelta(hours=1))
def run_digest(ctx: JobContext, payload: Digest) -> None:
    _record("digest", ctx, str(payload.n))


# -- atomic jobs (tests/api/test_atomic_jobs.py) -------------------------------------
ATOMIC_GATE_TIMEOUT = 60.0  # seconds a gated handler waits for its gate at most


@dataclass
class AtomicNote:
    """An atomic job: writes a Note of ``text`` in its job's transaction,
    records "atomic-wrote", then raises on attempts up to ``fail_until``, and
    on attempt ``hold_on`` holds its transaction open for ``hold`` seconds,
    or until the file ``gate`` exists, whatever ``ctx.cancel_requested``
    says. A second committed Note of one text would fail (unique)."""

    text: str
    fail_until: int = 0
    hold_on: int = 0
    hold: float = 0.0
    gate: str = ""


@job(atomic=True, retry=RetryPolicy.fixed(3, timedelta(milliseconds=50)))
def run_atomic_note(ctx: JobContext, payload: AtomicNote) -> None:
    _notes().create(text=payload.text, job_id=ctx.job_id, attempt=ctx.attempt)
    _record("atomic-wrote", ctx, payload.text)
    if ctx.attempt <= payload.fail_until:
        raise RuntimeError(f"attempt {ctx.attempt} fails after writing {payload.text!r}")
    if ctx.attempt == payload.hold_on:
        _hold(payload.hold, payload.gate)
    _record("atomic-returns", ctx, payload.text)


def _hold(seconds: float, gate: str) -> None:
    deadline = time.monotonic() + (seconds if not gate else ATOMIC_GATE_TIMEOUT)
    while time.monotonic() < deadline and not (gate and os.path.exists(gate)):
        time.sleep(0.01)


@dataclass
class AtomicOverrun:
    """An atomic job that writes and then runs past its timeout on attempt 1.
    Its retry is due once that attempt has returned: before, the retry's
    insert of the same text would wait for the row it holds (PostgreSQL)."""

    text: str


@job(
    atomic=True,
    timeout=timedelta(milliseconds=300),
    retry=RetryPolicy.fixed(1, timedelta(seconds=2)),
)
def run_atomic_overrun(ctx: JobContext, payload: AtomicOverrun) -> None:
    _notes().create(text=payload.text, job_id=ctx.job_id, attempt=ctx.attempt)
    _record("atomic-wrote", ctx, payload.text)
    if ctx.attempt == 1:
        time.sleep(1.0)  # past the timeout, not looking at ctx.cancel_requested
    _record("atomic-returns", ctx, payload.text)


@dataclass
class AtomicNested:
    """An atomic job whose own atomic block fails and is caught: the block
    rolls back to its savepoint, the job's other writes commit."""

    text: str


@job(atomic=True, retry=RetryPolicy.no_retries())
def run_atomic_nested(ctx: JobContext, payload: AtomicNested) -> None:
    from django.db import IntegrityError, transaction

    from later_django.conf import conf

    _notes().create(text=payload.text, job_id=ctx.job_id)
    try:
        with transaction.atomic(using=conf.database):
            _notes().create(text=f"{payload.text} (inner)", job_id=ctx.job_id)
            _notes().create(text=payload.text, job_id=ctx.job_id)  # a duplicate
    except IntegrityError:
        pass
    _notes().create(text=f"{payload.text} (after)", job_id=ctx.job_id)


@dataclass
class AtomicOrdered:
    """An atomic job of topic "ordered": writes the Note "<key>:<n>"; with
    ``fail_first``, attempt 1 raises after writing."""

    key: str
    n: int
    fail_first: bool = False

    def partition_key(self) -> str:
        return self.key


@job(topic="ordered", atomic=True, retry=RetryPolicy.fixed(3, timedelta(milliseconds=50)))
def run_atomic_ordered(ctx: JobContext, payload: AtomicOrdered) -> None:
    tag = f"{payload.key}:{payload.n}"
    _notes().create(text=tag, job_id=ctx.job_id, attempt=ctx.attempt)
    _record("atomic-wrote", ctx, tag)
    if payload.fail_first and ctx.attempt == 1:
        raise RuntimeError(f"first attempt of {tag} fails")


@dataclass
class Until:
    """Holds its worker until the wall clock reads ``at`` (epoch seconds), so
    jobs on several processes finish at the same moment."""

    at: float
    n: int = 0


@job
def run_until(ctx: JobContext, payload: Until) -> None:
    left = payload.at - time.clock_gettime(time.CLOCK_REALTIME)
    if left > 0:
        time.sleep(left)
    _record("until", ctx, str(payload.n))


@dataclass
class FanOut:
    """Enqueues ``width`` Noop jobs, and a Noop that runs after all of them."""

    width: int


@job
def run_fan_out(ctx: JobContext, payload: FanOut) -> None:
    parents = [ctx.enqueue(Noop(n=n)) for n in range(payload.width)]
    ctx.enqueue_continue_all(parents, Noop(n=1000))
    _record("fanout", ctx)
