"""Hypothesis fuzzing of the public API, on SQLite and on PostgreSQL.

Every call either returns a JobId whose row exists with the expected stage
(and whose payload a worker can decode), or raises one of the documented
errors -- TypeError, ValueError, JobNotFound, NotRegistered,
TransactionRequired, PayloadTooLarge -- and leaves the job count (and the
per-stage counters) unchanged: nothing is ever half-written.

Where the SPEC says which error an input gets, the tests say it too: an
unsupported payload value is a TypeError, a naive datetime a ValueError, an
unknown parent JobNotFound, and so on (see the ``expect_*`` models below).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import os
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.checks import ERROR
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import later_django as later
from later_django import (
    JobNotFound,
    NotRegistered,
    PayloadTooLarge,
    TransactionRequired,
    codec,
    job,
)
from later_django.clock import now_ms
from later_django.ids import new_job_id

DOCUMENTED = (
    TypeError,
    ValueError,
    JobNotFound,
    NotRegistered,
    TransactionRequired,
    PayloadTooLarge,
)
STAGES = ["enqueued", "delayed", "waiting", "running", "requeued", "success", "failed", "cancelled"]
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1  # what msgpack stores
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"

FUZZ = settings(
    # More for a deeper search: LATER_FUZZ_EXAMPLES=2000 pytest tests/api/test_fuzz_api.py
    max_examples=int(os.environ.get("LATER_FUZZ_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclasses.dataclass
class FuzzPayload:
    value: Any = None


@job
def run_fuzz_payload(ctx: later.JobContext, payload: FuzzPayload) -> None:
    """Never run: the fuzz tests only enqueue."""


@dataclasses.dataclass
class Unregistered:
    value: Any = None


@dataclasses.dataclass
class Inner:
    x: Any = None
    y: Any = None


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 9


# -- payload values --
def fixed_offsets() -> st.SearchStrategy[dt.tzinfo]:
    return st.one_of(
        st.just(dt.UTC),
        st.integers(-1439, 1439).map(lambda m: dt.timezone(dt.timedelta(minutes=m))),
    )


def aware_datetimes() -> st.SearchStrategy[dt.datetime]:
    return st.datetimes(timezones=st.one_of(fixed_offsets(), st.timezones()))


leaf_ok = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=INT_MIN, max_value=INT_MAX),
    st.floats(),
    st.text(),
    st.binary(),
    aware_datetimes(),
    st.dates(),
    st.decimals(),
    st.uuids(),
    st.sampled_from(list(Color)),
    st.sampled_from(list(Level)),
)
leaf_bad = st.one_of(
    st.integers(min_value=INT_MAX + 1),
    st.integers(max_value=INT_MIN - 1),
    st.datetimes(),  # naive
    st.times(),
    st.timedeltas(),
    st.complex_numbers(),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.builds(bytearray, st.binary(max_size=4)),
    st.builds(object),
    st.just(FuzzPayload),  # a class, not an instance
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates
)
keys = st.one_of(
    st.text(max_size=5),
    st.integers(min_value=INT_MIN, max_value=INT_MAX),
    st.integers(min_value=INT_MAX + 1),  # unsupported: too large
    st.booleans(),  # unsupported key types from here on
    st.floats(allow_nan=False),
    st.none(),
    st.tuples(st.integers()),
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.builds(Inner, children, children),
    )


values = st.recursive(st.one_of(leaf_ok, leaf_bad), _extend, max_leaves=12)


def has_surrogates(value: Any) -> bool:
    """A str that cannot be UTF-8 encoded is refused with a ValueError (the
    encoder's), not the codec's TypeError; both are documented errors."""
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, Inner):
        return has_surrogates(value.x) or has_surrogates(value.y)
    if isinstance(value, list | tuple):
        return any(has_surrogates(v) for v in value)
    if isinstance(value, dict):
        return any(has_surrogates(k) or has_surrogates(v) for k, v in value.items())
    return False


def unsupported_error(value: Any) -> type[BaseException] | tuple[type[BaseException], ...]:
    return (TypeError, ValueError) if has_surrogates(value) else TypeError


def supported(value: Any) -> bool:
    """The SPEC's payload values (section 3), as a model independent of the codec."""
    if value is None or isinstance(value, bool | float | bytes):
        return True
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, enum.Enum):
        return supported(value.value)
    if isinstance(value, int):
        return INT_MIN <= value <= INT_MAX
    if isinstance(value, dt.datetime):
        return value.utcoffset() is not None
    if isinstance(value, dt.date | Decimal | uuid.UUID):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(supported(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, list | tuple):
        return all(supported(v) for v in value)
    if isinstance(value, dict):
        return all(
            isinstance(k, str | int) and not isinstance(k, bool) and supported(k) and supported(v)
            for k, v in value.items()
        )
    return False


# -- helpers --
def state(later_db: Any) -> tuple[int, int]:
    """(rows in later_job, the sum of the per-stage counters)."""
    return later_db.job_count(), sum(later.stage_counts().values())


def attempt(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return call(), None
    except DOCUMENTED as exc:
        return None, exc


def assert_unchanged(later_db: Any, before: tuple[int, int], exc: BaseException) -> None:
    assert state(later_db) == before, f"{exc!r} left rows behind"


def assert_written(
    later_db: Any, job_id: Any, stages: set[str], before: tuple[int, int], added: int = 1
) -> None:
    assert isinstance(job_id, later.JobId), job_id
    rows, counted = state(later_db)
    assert rows == before[0] + added
    assert counted == rows, "the counters disagree with the rows"
    found = later_db.rows("SELECT stage, payload FROM later_job WHERE id = %s", [job_id])
    assert found, "the returned id has no row"
    stage, data = found[0]
    assert stage in stages, (stage, stages)
    codec.decode(bytes(data), FuzzPayload)  # a worker must be able to read it back


def raises_as(
    exc: BaseException | None, expected: type[BaseException] | tuple[type[BaseException], ...]
) -> None:
    assert exc is not None, f"expected {expected}, the call succeeded"
    assert isinstance(exc, expected), f"expected {expected}, got {exc!r}"


def small_limit(limit: int | None) -> Any:
    """Settings with MAX_PAYLOAD_BYTES = ``limit`` (None: the default)."""
    if limit is None:
        return override_settings()
    return override_settings(LATER={**django_settings.LATER, "MAX_PAYLOAD_BYTES": limit})


# -- payloads --
@FUZZ
@given(
    value=values,
    wrapper=st.sampled_from(["registered", "unregistered", "bare"]),
    limit=st.one_of(st.none(), st.integers(1, 400)),
)
def test_fuzz_enqueue_payloads(later_db, value, wrapper, limit):
    payload = {"registered": FuzzPayload, "unregistered": Unregistered}.get(wrapper, lambda v: v)(
        value
    )
    before = state(later_db)
    with small_limit(limit):
        job_id, exc = attempt(lambda: later.enqueue(payload))
    note(f"payload={payload!r} -> {exc!r}")
    if wrapper == "unregistered":
        raises_as(exc, NotRegistered)
    elif wrapper == "bare" and type(value) is not FuzzPayload:
        # Not a registered dataclass: NotRegistered or a plain TypeError
        # (NotRegistered is a TypeError too).
        raises_as(exc, TypeError)
    elif not supported(value):
        raises_as(exc, unsupported_error(value))
    elif exc is not None:
        raises_as(exc, PayloadTooLarge)
        assert limit is not None and len(codec.encode(payload)) > limit
    if exc is None:
        assert_written(later_db, job_id, {"enqueued"}, before)
    else:
        assert_unchanged(later_db, before, exc)


@FUZZ
@given(
    payload_values=st.lists(st.one_of(leaf_ok, leaf_bad), max_size=6),
    priority=st.integers(-150, 150),
)
def test_fuzz_enqueue_many_is_all_or_nothing(later_db, payload_values, priority):
    payloads = [FuzzPayload(v) for v in payload_values]
    before = state(later_db)
    ids, exc = attempt(lambda: later.enqueue_many(payloads, priority=priority))
    ok = all(supported(v) for v in payload_values) and -100 <= priority <= 100
    note(f"{payloads!r} priority={priority} -> {exc!r}")
    if not ok:
        assert exc is not None
        assert_unchanged(later_db, before, exc)
        return
    assert exc is None, exc
    assert len(ids) == len(payloads)
    if ids:
        assert_written(later_db, ids[-1], {"enqueued"}, before, added=len(ids))
    else:
        assert state(later_db) == before


@FUZZ
@given(value=st.one_of(leaf_ok, leaf_bad), in_atomic=st.booleans(), rollback=st.booleans())
def test_fuzz_enqueue_in(later_db, value, in_atomic, rollback):
    payload = FuzzPayload(value)
    before = state(later_db)

    class Rollback(Exception):
        pass

    if not in_atomic:
        _, exc = attempt(lambda: later.enqueue_in(payload))
        raises_as(exc, TransactionRequired if supported(value) else DOCUMENTED)
        assert_unchanged(later_db, before, exc)
        return
    result: dict[str, Any] = {}
    try:
        with transaction.atomic(using=later_db.alias):
            result["id"], result["exc"] = attempt(lambda: later.enqueue_in(payload))
            if rollback:
                raise Rollback
    except Rollback:
        assert state(later_db) == before, "a rolled-back transaction left its job"
        return
    exc = result["exc"]
    if not supported(value):
        raises_as(exc, unsupported_error(value))
        assert_unchanged(later_db, before, exc)
    else:
        assert exc is None, exc
        assert_written(later_db, result["id"], {"enqueued"}, before)


# -- priorities --
@FUZZ
@given(
    priority=st.one_of(
        st.integers(-200, 200),
        st.integers(),
        st.booleans(),
        st.text(max_size=3),
        st.floats(),
        st.none(),
        st.sampled_from(list(Level)),
        st.decimals(allow_nan=False),
    )
)
def test_fuzz_priorities(later_db, priority):
    before = state(later_db)
    job_id, exc = attempt(lambda: later.enqueue(FuzzPayload(1), priority=priority))
    note(f"priority={priority!r} -> {exc!r}")
    if priority is None:  # not given: the type's priority (FuzzPayload's @job gives none)
        assert exc is None, exc
    elif not isinstance(priority, int) or isinstance(priority, bool):
        raises_as(exc, TypeError)
    elif not -100 <= priority <= 100:
        raises_as(exc, ValueError)
    if exc is None:
        assert_written(later_db, job_id, {"enqueued"}, before)
        stored = later_db.scalar("SELECT priority FROM later_job WHERE id = %s", [job_id])
        assert stored == (0 if priority is None else priority)
    else:
        assert_unchanged(later_db, before, exc)


# -- delays and datetimes --
@FUZZ
@given(
    delay=st.one_of(
        st.timedeltas(),
        st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=3650)),
        st.timedeltas(max_value=dt.timedelta(0)),
        st.just(dt.timedelta.max),
        st.integers(),
        st.floats(),
        st.none(),
        st.text(max_size=3),
        st.datetimes(),
    )
)
def test_fuzz_delays(later_db, delay):
    before = state(later_db)
    job_id, exc = attempt(lambda: later.enqueue_delayed(FuzzPayload(2), delay))
    note(f"delay={delay!r} -> {exc!r}")
    if not isinstance(delay, dt.timedelta):
        raises_as(exc, TypeError)
    elif delay < dt.timedelta(0):
        raises_as(exc, ValueError)
    if exc is not None:
        assert_unchanged(later_db, before, exc)
        return
    delay_ms = int(delay.total_seconds() * 1000)
    stages = (
        {"delayed"}
        if delay_ms > 1000
        else {"enqueued"}
        if delay_ms == 0
        else {"enqueued", "delayed"}
    )
    assert_written(later_db, job_id, stages, before)


@FUZZ
@given(
    when=st.one_of(
        aware_datetimes(),
        st.datetimes(),  # naive
        st.just(dt.datetime.max.replace(tzinfo=dt.UTC)),
        st.just(dt.datetime.min.replace(tzinfo=dt.UTC)),
        st.just(dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-23)))),
        st.just(dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=23)))),
        st.dates(),
        st.integers(),
        st.floats(),
        st.none(),
        st.text(max_size=3),
    )
)
def test_fuzz_datetimes(later_db, when):
    before = state(later_db)
    start = now_ms()
    job_id, exc = attempt(lambda: later.enqueue_delayed_at(FuzzPayload(3), when))
    note(f"when={when!r} -> {exc!r}")
    if not isinstance(when, dt.datetime):
        raises_as(exc, TypeError)
    elif when.utcoffset() is None:
        raises_as(exc, ValueError)
    if exc is not None:
        assert_unchanged(later_db, before, exc)
        return
    when_ms = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
    stages = (
        {"delayed"}
        if when_ms > start + 1000
        else {"enqueued"}
        if when_ms <= start
        else {"enqueued", "delayed"}
    )
    assert_written(later_db, job_id, stages, before)


# -- parents --
def make_parents(later_db: Any) -> dict[str, str]:
    """One job in every stage (set directly: no worker runs here)."""
    parents = {}
    for stage in STAGES:
        job_id = later.enqueue(FuzzPayload(stage))
        later_db.rows("UPDATE later_job SET stage = %s WHERE id = %s RETURNING id", [stage, job_id])
        parents[stage] = job_id
    return parents


CHILD_STAGE = {"success": "enqueued", "failed": "failed", "cancelled": "failed"}


@FUZZ
@given(data=st.data())
def test_fuzz_parents(later_db, data):
    parents = getattr(later_db, "fuzz_parents", None)
    if parents is None or later.get_job(parents["success"]) is None:
        parents = later_db.fuzz_parents = make_parents(later_db)
    kind = data.draw(st.sampled_from(["real", "real-upper", "unknown", "text", "other"]))
    if kind.startswith("real"):
        stage = data.draw(st.sampled_from(STAGES))
        parent: Any = parents[stage]
        if kind == "real-upper":
            parent = parent.upper()
    elif kind == "unknown":
        parent = data.draw(
            st.one_of(
                st.builds(new_job_id),
                st.text(alphabet=ALPHABET, min_size=26, max_size=26),
            )
        )
    elif kind == "text":
        parent = data.draw(st.text(max_size=30))
    else:
        parent = data.draw(
            st.one_of(
                st.none(),
                st.integers(),
                st.binary(max_size=26),
                st.builds(uuid.uuid4),
                st.lists(st.text(), max_size=2),
            )
        )
    before = state(later_db)
    job_id, exc = attempt(lambda: later.enqueue_continue(parent, FuzzPayload("child")))
    note(f"parent={parent!r} ({kind}) -> {exc!r}")
    if kind == "other":
        raises_as(exc, TypeError)
    elif kind == "unknown" and parent not in parents.values():
        raises_as(exc, JobNotFound)
    elif kind == "text" and not (len(parent) == 26 and all(c in ALPHABET for c in parent.lower())):
        raises_as(exc, ValueError)
    if exc is not None:
        assert_unchanged(later_db, before, exc)
        return
    parent_stage = later_db.stage_of(parent.lower())
    expected = CHILD_STAGE.get(parent_stage, "waiting")
    assert_written(later_db, job_id, {expected}, before)
    info = later.get_job(job_id)
    assert info.parent_id == parent.lower()
    if expected == "failed":
        assert info.last_error == "parent failed"


# -- lookups --
@FUZZ
@given(
    job_id=st.one_of(
        st.text(max_size=30),
        st.builds(new_job_id),
        st.none(),
        st.integers(),
        st.binary(max_size=26),
    )
)
def test_fuzz_get_job_and_cancel(later_db, job_id):
    before = state(later_db)
    for call in (later.get_job, later.cancel):
        result, exc = attempt(lambda call=call: call(job_id))
        if not isinstance(job_id, str):
            raises_as(exc, TypeError)
        elif exc is not None:
            raises_as(exc, ValueError)
        else:
            assert result in (None, False), result
    assert state(later_db) == before


# -- settings --
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300),
    st.text(max_size=4),
    st.floats(allow_nan=False),
    st.lists(st.integers(), max_size=2),
    st.timedeltas(min_value=dt.timedelta(seconds=-5), max_value=dt.timedelta(seconds=5)),
)
hashable_junk = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 300), st.text(max_size=4), st.floats(allow_nan=False)
)
positive_timedeltas = st.timedeltas(
    min_value=dt.timedelta(milliseconds=1), max_value=dt.timedelta(hours=2)
)
TIMING_KEYS = [
    "LEASE_DURATION",
    "STUCK_JOB_GRACE",
    "MAINTENANCE_INTERVAL",
    "POLL_INTERVAL",
    "SUPERVISOR_INTERVAL",
    "HUNG_WORKER_THRESHOLD",
    "SHUTDOWN_TIMEOUT",
    "DASHBOARD_RETENTION",
    "AUTOSCALE_INTERVAL",
]


def later_settings(alias: str) -> st.SearchStrategy[dict[str, Any]]:
    optional: dict[str, st.SearchStrategy[Any]] = {
        # Hashable values only: an unhashable alias crashes the check (see
        # test_check_reports_an_unhashable_database_alias).
        "DATABASE": st.one_of(st.just(alias), st.sampled_from(["nope", ""]), hashable_junk),
        "NAMESPACE": st.one_of(st.text(min_size=1, max_size=64), st.text(min_size=65), junk),
        "WORKERS": st.one_of(st.integers(-2, 300), junk),
        "AUTOSCALE": st.one_of(
            st.none(), st.tuples(st.integers(-1, 300), st.integers(-1, 300)), junk
        ),
        "DEFAULT_RETRY_COUNT": st.one_of(st.integers(-2, 20), junk),
        "TOPICS": st.one_of(
            st.dictionaries(st.text(max_size=5), st.integers(-1, 9), max_size=2), junk
        ),
        "MAX_PAYLOAD_BYTES": st.one_of(st.integers(-2, 2000), junk),
        "RECURRING_SEQUENTIAL_PARTITIONS": st.one_of(st.none(), st.integers(-1, 9), junk),
        "VACUUM_INTERVAL": st.one_of(st.none(), positive_timedeltas, junk),
    }
    for key in TIMING_KEYS:
        optional[key] = st.one_of(positive_timedeltas, junk)
    return st.fixed_dictionaries({}, optional=optional)


@FUZZ
@given(data=st.data())
def test_fuzz_settings(later_db, data):
    """Any LATER dict: the system checks report it without crashing; when they
    find no error, the API works under it (or refuses a payload as documented)."""
    from later_django.checks import check_settings
    from later_django.worker.server import Server

    fuzzed = data.draw(later_settings(later_db.alias))
    with override_settings(LATER={**django_settings.LATER, **fuzzed}):
        messages = check_settings()
        errors = [m for m in messages if m.level >= ERROR]
        note(f"LATER={fuzzed!r} -> {[m.id for m in errors]}")
        for message in errors:
            assert message.id.startswith("later.E"), message
        if errors:
            return
        before = state(later_db)
        job_id, exc = attempt(lambda: later.enqueue(FuzzPayload("settings")))
        if exc is not None:
            raises_as(exc, PayloadTooLarge)
            assert_unchanged(later_db, before, exc)
        else:
            assert later_db.stage_of(job_id) == "enqueued"
        Server()  # a server can be built from any settings the checks accept


@pytest.mark.parametrize("value", [float("nan"), Decimal("sNaN"), "\x00", b"\x00" * 3])
def test_odd_but_supported_values_round_trip(later_db, value):
    """Values a fuzzer finds first, kept as plain regression cases."""
    before = state(later_db)
    job_id = later.enqueue(FuzzPayload(value))
    assert_written(later_db, job_id, {"enqueued"}, before)


# -- bugs the fuzzer found, kept as regression tests ----------------------------------
@pytest.mark.parametrize("far", ["delay", "when"])
def test_enqueue_delayed_beyond_year_9999_raises_value_error(later_db, far):
    """enqueue_delayed(timedelta.max) / enqueue_delayed_at(datetime.max) are
    refused with ValueError and write nothing."""
    before = state(later_db)
    with pytest.raises(ValueError, match="9999"):
        if far == "delay":
            later.enqueue_delayed(FuzzPayload(0), dt.timedelta.max)
        else:
            later.enqueue_delayed_at(FuzzPayload(0), dt.datetime.max.replace(tzinfo=dt.UTC))
    assert state(later_db) == before
