"""Per-queue rate limits across every server (docs/how-to/rate-limits.md): the
setting and its check, the claim that keeps the limit exact under
concurrent claimers, a server that waits out a spent window without
claiming, the Queues panel and the metric, and three worker processes held
to 10 starts a second for 30 seconds."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections, transaction
from django.test import Client

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, LimitedClaim, LimitedClaimRequest
from later_django.limits import QueueLimits, RateLimit, parse_rate_limit
from later_django.metrics import read_limited_jobs
from later_django.worker.server import Server
from tests.helpers import (
    LaterDb,
    await_until,
    in_thread,
    read_records,
    serve,
    set_later,
    wait_until,
)
from tests.jobapp.jobs import Noop

HOUR_MS = 3_600_000


def rate_queues(rate: str) -> dict[str, dict[str, str]]:
    return {"default": {}, "emails": {"rate_limit": rate}}


@pytest.fixture
def emails_3_per_hour(later_db: LaterDb, settings: Any) -> LaterDb:
    """``later_db`` with queue "emails" limited to 3 starts an hour."""
    set_later(settings, QUEUES=rate_queues("3/h"))
    return later_db


def claim_limited(later_db: LaterDb, limits: QueueLimits, *, limit: int = 10) -> LimitedClaim:
    """One limited claim of queue "emails", as a server's claimer makes it."""
    request = LimitedClaimRequest(
        claim=ClaimRequest(
            namespace="default", owner="server-a", limit=limit, lease_ms=30_000, queue="emails"
        ),
        limits=limits,
    )
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        return dialect.limits.claim_limited(c, request)


THREE_AN_HOUR = QueueLimits(rate=RateLimit(count=3, window_ms=HOUR_MS))


# -- the setting ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "count", "window_ms"),
    [("100/m", 100, 60_000), ("10/s", 10, 1_000), ("1/h", 1, 3_600_000), (" 5 / s ", 5, 1_000)],
)
def test_a_rate_limit_is_n_starts_per_second_minute_or_hour(text, count, window_ms):
    assert parse_rate_limit(text) == RateLimit(count=count, window_ms=window_ms)


@pytest.mark.parametrize("text", ["100", "100/d", "0/s", "-1/s", "ten/s", "1.5/s", ""])
def test_a_malformed_rate_limit_is_a_value_error_naming_the_form(text):
    with pytest.raises(ValueError, match=r"is not a rate limit; write 'N/s', 'N/m' or 'N/h'"):
        parse_rate_limit(text)
    with pytest.raises(TypeError, match="rate_limit must be a str such as '100/m', got int"):
        parse_rate_limit(100)


def test_a_bad_rate_limit_or_queue_option_is_check_e025(settings):
    set_later(settings, QUEUES={"default": {}, "emails": {"rate_limit": "100/d", "burst": 5}})
    messages = [m for m in run_checks() if m.id == "later.E025"]
    assert [m.msg for m in messages] == [
        "LATER['QUEUES']['emails'] has unknown options 'burst'; a queue takes rate_limit.",
        "LATER['QUEUES']['emails']['rate_limit']='100/d' is not a rate limit; write 'N/s', "
        "'N/m' or 'N/h' with N from 1 to 1000000000 starts per second, minute or hour, "
        "e.g. '100/m'.",
    ]
    assert all("docs/how-to/rate-limits.md" in m.hint for m in messages)
    with pytest.raises(SystemCheckError, match="later.E025"):
        call_command("check")
    set_later(settings, QUEUES=rate_queues("100/m"))
    assert [m for m in run_checks() if m.id == "later.E025"] == []


def test_a_server_refuses_a_malformed_rate_limit_naming_the_setting(settings):
    set_later(settings, QUEUES=rate_queues("fast"))
    with pytest.raises(ValueError, match=r"LATER\['QUEUES'\]\['emails'\]\['rate_limit'\]='fast'"):
        Server(queues={"emails": 1})


def test_only_a_queue_with_a_rate_limit_claims_with_the_limited_claim(settings):
    """A queue without limits keeps the plain claim: its claimer has no
    limits, and its batch is the plain one."""
    set_later(settings, QUEUES=rate_queues("10/s"))
    server = Server(queues={"emails": 1, "default": 1})
    emails, default = (queue.claimer for queue in server.queues)
    assert emails.limits == QueueLimits(rate=RateLimit(count=10, window_ms=1_000))
    assert default.limits is None
    assert default._claims._flush == default._claim_batch


# -- the claim ----------------------------------------------------------------------------
def test_a_rate_limited_claim_starts_at_most_n_a_window_then_says_when_the_next_starts(
    emails_3_per_hour,
):
    later_db = emails_3_per_hour
    jobs = [later.enqueue(Noop(n=n), queue="emails") for n in range(5)]
    first = claim_limited(later_db, THREE_AN_HOUR, limit=2)
    assert [job.id for job in first.jobs] == jobs[:2]
    assert first.retry_in_ms is None, "one start is left in the window"
    second = claim_limited(later_db, THREE_AN_HOUR, limit=10)
    assert [job.id for job in second.jobs] == jobs[2:3], "only the start left"
    now = later_db.now_ms()
    window_end = (now // HOUR_MS + 1) * HOUR_MS
    assert second.retry_in_ms is not None
    assert abs(now + second.retry_in_ms - window_end) < 1_000, "the window ends on the hour"
    third = claim_limited(later_db, THREE_AN_HOUR)
    assert third.jobs == [] and third.retry_in_ms is not None
    row = later_db.rows(
        "SELECT rate_window_ms, rate_window_end_ms, rate_started, paused FROM later_queue "
        "WHERE name = 'emails'"
    )
    assert row == [((now // HOUR_MS) * HOUR_MS, window_end, 3, False)]
    assert later.pause_queue("emails") is True, "the row the limit wrote is not a pause"
    later.resume_queue("emails")
    # The next window: the row's window is an hour back, its count starts again.
    later_db.execute(
        "UPDATE later_queue SET rate_window_ms = rate_window_ms - %s, "
        "rate_window_end_ms = rate_window_end_ms - %s",
        [HOUR_MS, HOUR_MS],
    )
    assert [job.id for job in claim_limited(later_db, THREE_AN_HOUR).jobs] == jobs[3:]
    assert later_db.scalar("SELECT rate_started FROM later_queue WHERE name = 'emails'") == 2


def test_a_paused_rate_limited_queue_starts_nothing_and_counts_nothing(emails_3_per_hour):
    later_db = emails_3_per_hour
    later.enqueue(Noop(n=1), queue="emails")
    later.pause_queue("emails")
    assert claim_limited(later_db, THREE_AN_HOUR).jobs == []
    assert later_db.scalar("SELECT rate_started FROM later_queue WHERE name = 'emails'") == 0


def test_concurrent_rate_limited_claims_start_no_more_than_the_limit(emails_3_per_hour):
    """Claims of many servers at once: the queue's row lock makes the count
    exact, whichever claim comes first."""
    later_db = emails_3_per_hour
    later.enqueue_many([Noop(n=n) for n in range(30)], queue="emails")
    start = threading.Barrier(6)

    def one_claim(_: int) -> int:
        try:
            start.wait()
            return len(claim_limited(later_db, THREE_AN_HOUR, limit=2).jobs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(6) as pool:
        taken = list(pool.map(one_claim, range(6)))
    assert sum(taken) == 3, taken
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE stage = 'running'") == 3


TWO_A_SECOND = QueueLimits(rate=RateLimit(count=2, window_ms=1_000))


def test_claims_of_different_units_count_in_the_larger_window_and_never_reset_it(
    emails_3_per_hour,
):
    """Mid-deploy, servers with "2/s" and "3/h" for one queue: the hour's
    claim widens the row's window to its hour, keeping the second's starts;
    a second's claim inside that hour counts there, against its own 2."""
    later_db = emails_3_per_hour
    jobs = [later.enqueue(Noop(n=n), queue="emails") for n in range(8)]
    hour = (later_db.now_ms() // HOUR_MS) * HOUR_MS
    assert [job.id for job in claim_limited(later_db, TWO_A_SECOND).jobs] == jobs[:2]
    hourly = claim_limited(later_db, THREE_AN_HOUR)
    assert [job.id for job in hourly.jobs] == jobs[2:3], "the second's 2 starts count in the hour"
    again = claim_limited(later_db, TWO_A_SECOND)
    assert again.jobs == [], "3 started in the row's window, above the second's 2"
    now = later_db.now_ms()
    assert again.retry_in_ms is not None
    assert abs(now + again.retry_in_ms - (hour + HOUR_MS)) < 1_000, "waits for the hour's end"
    assert later_db.rows(
        "SELECT rate_window_ms, rate_window_end_ms, rate_started FROM later_queue"
    ) == [(hour, hour + HOUR_MS, 3)]
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE stage = 'running'") == 3


def test_a_claim_stamped_before_a_newer_window_counts_in_it(later_db, settings):
    """PostgreSQL reads a statement's clock before the statement waits for
    the queue's row: a claim stamped in one second that gets the row after
    a claim of the next second committed counts in that newer second. The
    window never moves back, so that second starts no more than its 3."""
    alias = later_db.alias
    dialect = dialect_for(alias)
    if dialect.single_writer:
        pytest.skip("one writer at a time: a claim reads the clock holding the write lock")
    set_later(settings, QUEUES=rate_queues("3/s"))
    three = QueueLimits(rate=RateLimit(count=3, window_ms=1_000))
    later.enqueue_many([Noop(n=n) for n in range(10)], queue="emails")
    later.pause_queue("emails")  # the row the claims lock
    later.resume_queue("emails")
    locked, go = threading.Event(), threading.Event()
    claimed: dict[str, LimitedClaim] = {}

    def newer() -> None:
        """The claim that gets the row first: it locks it, then claims, in
        one transaction, once the clock is past the other's second."""
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as c:
                c.execute("SELECT 1 FROM later_queue WHERE name = 'emails' FOR UPDATE")
                locked.set()
                assert go.wait(10)
                request = LimitedClaimRequest(
                    claim=ClaimRequest(
                        namespace="default", owner="b", limit=10, lease_ms=30_000, queue="emails"
                    ),
                    limits=three,
                )
                claimed["newer"] = dialect.limits.claim_limited(c, request)
        finally:
            connections.close_all()

    def older() -> None:
        try:
            claimed["older"] = claim_limited(later_db, three)
        finally:
            connections.close_all()

    first = threading.Thread(target=newer)
    first.start()
    assert locked.wait(10)
    second = threading.Thread(target=older)
    second.start()
    stamp = wait_until(
        lambda: later_db.scalar(
            "SELECT (date_part('epoch', query_start) * 1000)::bigint FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query LIKE '%%INSERT INTO later_queue%%'"
        ),
        10,
        "the older claim to wait for the row",
    )
    stamped = (int(stamp) // 1000) * 1000  # type: ignore[call-overload]
    wait_until(lambda: later_db.now_ms() >= stamped + 1_000, 5, "the next second")
    go.set()
    first.join(10)
    second.join(10)
    assert len(claimed["newer"].jobs) == 3
    assert claimed["older"].jobs == [], "the older claim took starts of the newer second"
    window, started = later_db.rows(
        "SELECT rate_window_ms, rate_started FROM later_queue WHERE name = 'emails'"
    )[0]
    assert window > stamped and started == 3  # type: ignore[operator]
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE stage = 'running'") == 3


# -- a server --------------------------------------------------------------------------
def test_a_server_starts_at_most_the_limit_a_window_and_waits_without_claiming(
    later_db, settings, record
):
    """4 starts a second with 3 workers: never more than 4 starts in a
    second (by the database's start times), and while a window is spent its
    workers wait for the next without sending a claim."""
    set_later(settings, QUEUES=rate_queues("4/s"))
    jobs = [later.enqueue(Noop(n=n), queue="emails") for n in range(12)]
    claims: list[LimitedClaim] = []

    def count_claims(server: Server) -> None:
        sessions = server.queues[0].claimer.sessions
        claim = sessions.claim_limited

        async def counted(request: LimitedClaimRequest) -> LimitedClaim:
            claimed = await claim(request)
            claims.append(claimed)
            return claimed

        sessions.claim_limited = counted  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        await await_until(
            lambda: in_thread(lambda: all(later_db.stage_of(j) == "success" for j in jobs)),
            20,
            "every job ran",
        )

    started = time.monotonic()
    serve(body, workers=3, queues={"emails": 3}, before_start=count_claims)
    elapsed = time.monotonic() - started
    starts = [int(ms) for (ms,) in later_db.rows("SELECT started_ms FROM later_job")]
    per_second = Counter(ms // 1000 for ms in starts)
    assert max(per_second.values()) <= 4, per_second
    assert len(per_second) >= 3, "12 jobs at 4 a second take three windows"
    # A spent window costs one claim that says so; the workers then wait for
    # the next window, however often they are polled (every 50 ms here).
    spent = sum(1 for claimed in claims if not claimed.jobs)
    assert spent <= 2 * len(per_second) + 2, (len(claims), elapsed)
    assert len(claims) < elapsed / 0.05 / 2, "fewer claims than polls"


# -- what the dashboard and the metrics show --------------------------------------------
def test_the_queues_panel_shows_a_rate_limited_queues_starts_in_this_window(
    emails_3_per_hour, settings
):
    later_db = emails_3_per_hour
    later.enqueue_many([Noop(n=n) for n in range(5)], queue="emails")
    claim_limited(later_db, THREE_AN_HOUR, limit=2)
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="later_django", codename="view_dashboard")
    )
    client = Client()
    client.force_login(user)
    data = json.loads(client.get("/admin/later/api/queues").content)
    by_name = {row["name"]: row for row in data["queues"]}
    rate = by_name["emails"]["rate"]
    assert {key: rate[key] for key in ("limit", "count", "window", "started")} == {
        "limit": "3/h",
        "count": 3,
        "window": "hour",
        "started": 2,
    }
    assert rate["window_ends_ms"] % HOUR_MS == 0
    assert by_name["default"]["rate"] is None
    page = client.get("/admin/later/queues/").content.decode()
    assert "2</span> of 3 started this hour" in page


def test_the_metric_counts_ready_jobs_a_spent_window_holds_back(emails_3_per_hour):
    later_db = emails_3_per_hour
    later.enqueue_many([Noop(n=n) for n in range(5)], queue="emails")
    assert read_limited_jobs() == {"emails": 0}, "the window is not spent"
    claim_limited(later_db, THREE_AN_HOUR)
    assert read_limited_jobs() == {"emails": 2}
    later_db.execute(
        "UPDATE later_queue SET rate_window_ms = rate_window_ms - %s, "
        "rate_window_end_ms = rate_window_end_ms - %s",
        [HOUR_MS, HOUR_MS],
    )
    assert read_limited_jobs() == {"emails": 0}, "a new window"


# -- across processes (the acceptance) -----------------------------------------
RATE = 10  # starts a second
SPAN = 30.0  # seconds measured


def test_three_processes_start_ten_jobs_a_second_within_ten_percent(later_db, workers, settings):
    """``10/s`` over 30 s across three later_worker processes: the starts
    their handlers record come to 300 within 10 %, and no second of the
    database's clock has more than 10 starts."""
    set_later(settings, QUEUES=rate_queues(f"{RATE}/s"))
    env = {"LATER_TEST_SETTINGS": json.dumps({"QUEUES": rate_queues(f"{RATE}/s")})}
    procs = [workers.start("--queues", "emails=4", workers=None, env=env) for _ in range(3)]
    workers.wait_registered(*procs)
    later.enqueue_many([Noop(n=n) for n in range(int(RATE * SPAN * 1.5))], queue="emails")

    def first_start() -> float:
        records = read_records(workers.record, "noop")
        return min(r.start for r in records) if records else 0.0

    t0 = wait_until(first_start, 30, lambda: f"a first start\n{workers.logs()}")
    deadline = t0 + SPAN

    def past_the_span() -> list[Any]:
        records = read_records(workers.record, "noop")
        return records if any(r.start >= deadline for r in records) else []

    # The jobs outnumber the span's starts: one starts after it.
    records = wait_until(
        past_the_span, SPAN + 30, lambda: f"a start after the span\n{workers.logs()}"
    )
    in_span = [r for r in records if t0 <= r.start < deadline]
    assert abs(len(in_span) - RATE * SPAN) <= 0.1 * RATE * SPAN, len(in_span)
    assert len({r.pid for r in in_span}) == 3, "every process started jobs"
    starts = [int(ms) for (ms,) in later_db.rows(
        "SELECT started_ms FROM later_job WHERE started_ms IS NOT NULL"
    )]  # fmt: skip
    per_second = Counter(ms // 1000 for ms in starts)
    assert max(per_second.values()) <= RATE, per_second.most_common(3)
