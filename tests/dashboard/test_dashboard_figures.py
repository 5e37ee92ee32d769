"""The dashboard's figures: the wait histograms' maths (dashboard/waits.py),
the worker's recorder, the per-second rows a real Server writes and the
overview reads back, and the leader's per-minute backlog samples with their
pruning and the graph's endpoint. The database tests run on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import math
import random
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db import connections, transaction
from django.test import Client

import later_django as later
from later_django.dashboard import reads
from later_django.dashboard import recorder as recorder_module
from later_django.dashboard.recorder import Recorder
from later_django.dashboard.waits import (
    Waits,
    bucket_of,
    decode,
    encode,
    merged,
    upper_ms,
)
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest
from later_django.leases import Leader
from later_django.maintenance.steps import (
    SAMPLES_KEPT_MS,
    STATS_KEPT_MS,
    StepContext,
    sample_queue,
)
from later_django.worker.server import Server
from tests.helpers import LaterDb, await_until, in_thread, serve, set_later
from tests.jobapp.jobs import Noop, Ordered

# Django's version changes nothing in what these check (later's SQL and
# actions): they run in the first tox env only (tox.ini), like the process tests.
pytestmark = pytest.mark.one_env

BASE = "/admin/later/"
HOUR = timedelta(hours=1)
STEP = 10 ** (1 / 10)  # the ratio of two buckets' upper bounds


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


@pytest.fixture
def viewer(later_db: LaterDb) -> Client:
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="later_django", codename="view_dashboard")
    )
    client = Client()
    client.force_login(user)
    return client


def _json(client: Client, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, (url, response.content[:500])
    return json.loads(response.content)


# -- wait histograms -------------------------------------------------------------------
def test_each_wait_falls_in_the_bucket_whose_bounds_hold_it() -> None:
    assert [bucket_of(w) for w in (-5, 0, 0.5, 1)] == [0, 0, 0, 0]
    assert [bucket_of(w) for w in (2, 10, 11, 100, 101, 1000, 60_000)] == [
        4, 10, 11, 20, 21, 30, 48,
    ]  # fmt: skip
    assert upper_ms(0) == 1 and upper_ms(10) == 10 and upper_ms(30) == pytest.approx(1000)
    for wait in range(2, 200_000):
        bucket = bucket_of(wait)
        assert upper_ms(bucket - 1) < wait <= upper_ms(bucket), wait
    for bucket in range(1, 80):
        assert upper_ms(bucket) / upper_ms(bucket - 1) == pytest.approx(STEP)


def _true_percentile(values: list[int], q: float) -> int:
    """The nearest-rank percentile: the smallest value with q of them at or below."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


@pytest.mark.parametrize("seed", range(6))
def test_percentiles_are_within_one_bucket_of_the_truth(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([1, 2, 7, 100, 5000])
    values = [
        int(rng.lognormvariate(rng.uniform(0, 8), rng.uniform(0.2, 2.5))) for _ in range(size)
    ]
    waits = Waits.empty()
    for value in values:
        waits.add(value)
    summary = waits.summary()
    assert summary is not None
    assert summary.count == size
    assert summary.avg_ms == pytest.approx(sum(values) / size)
    assert summary.max_ms == max(values)
    for q, shown in ((0.5, summary.p50_ms), (0.95, summary.p95_ms)):
        truth = _true_percentile(values, q)
        # Never below the truth, never past its bucket's bound or the largest wait.
        assert truth <= shown <= max(1.0, truth * STEP), (q, truth, shown)
        assert bucket_of(shown) == bucket_of(truth)
        assert shown <= summary.max_ms
    assert summary.p50_ms <= summary.p95_ms <= summary.max_ms


def test_histograms_merge_across_servers_as_one() -> None:
    rng = random.Random(11)
    values = [rng.randrange(0, 120_000) for _ in range(3000)]
    whole = Waits.empty()
    servers = [Waits.empty() for _ in range(3)]
    for value in values:
        whole.add(value)
        rng.choice(servers).add(value)
    rows = [(encode(s.counts), s.sum_ms, s.max_ms) for s in servers]
    together = merged(rows)
    assert together.counts == whole.counts
    assert (together.sum_ms, together.max_ms) == (sum(values), max(values))
    assert together.summary() == whole.summary()
    # A row as stored: a JSON object of bucket to count, buckets sorted.
    assert encode({20: 2, 3: 1}) == '{"3":1,"20":2}'
    assert decode('{"3":1,"20":2}') == {3: 1, 20: 2}
    assert decode(encode(whole.counts)) == whole.counts


def test_no_wait_gives_no_summary() -> None:
    assert Waits.empty().summary() is None
    assert merged([]).summary() is None
    assert merged([("", 0, 0), ("", 0, 0)]).summary() is None
    assert decode("") == {}
    one = merged([("{}", 0, 0), ('{"14":1}', 20, 20)]).summary()
    assert one is not None and (one.count, one.p50_ms, one.max_ms) == (1, 20.0, 20.0)


def test_the_recorder_counts_until_taken_then_starts_afresh() -> None:
    recorder = Recorder()
    assert recorder.take() is None
    recorder.started += 3
    recorder.finished("succeeded", 400, partitioned=False)
    recorder.finished("retry", 2000, partitioned=True)
    recorder.finished("failed", -60_000, partitioned=False)  # a clock behind
    row = recorder.take()
    assert row is not None
    assert (row.started, row.succeeded, row.retried, row.failed) == (3, 1, 1, 1)
    regular, partition = decode(row.regular_waits), decode(row.partition_waits)
    assert sum(regular.values()) == 2 and sum(partition.values()) == 1
    assert regular[0] == 1, "a negative wait counts as none"
    assert 400 <= row.regular_max_ms < 1000 and row.regular_sum_ms == row.regular_max_ms
    assert bucket_of(row.regular_max_ms) in regular
    assert 2000 <= row.partition_max_ms < 3000
    assert recorder.take() is None, "taken: it starts afresh"
    recorder.started += 1  # a start alone is worth a row
    again = recorder.take()
    assert again is not None and (again.started, again.succeeded) == (1, 0)
    assert again.regular_waits == "{}" and again.regular_max_ms == 0
    assert recorder.take() is None


# -- a real server's figures --------------------------------------------------------------
def test_a_server_writes_its_figures_and_the_overview_shows_them(
    later_db: LaterDb, viewer: Client, settings: Any
) -> None:
    set_later(settings, TOPICS={"ordered": 2})
    plain, partitioned = 12, 5

    def enqueue_all() -> None:
        later.enqueue_many(Noop(n=i) for i in range(plain))
        for n in range(partitioned):
            later.enqueue_to_partition(Ordered("k", n))

    def stat_totals() -> tuple[int, ...]:
        with connections[later_db.alias].cursor() as cursor:
            cursor.execute(
                "SELECT COALESCE(SUM(started), 0), COALESCE(SUM(succeeded), 0), "
                "COALESCE(SUM(retried), 0), COALESCE(SUM(failed), 0), COUNT(*) "
                "FROM later_dashboard_stat"
            )
            return tuple(int(v) for v in cursor.fetchone())

    async def body(server: Server) -> tuple[int, ...]:
        await in_thread(enqueue_all)
        total = plain + partitioned

        async def written() -> tuple[int, ...] | None:
            totals = await in_thread(stat_totals)
            return totals if totals[1] == total else None

        return await await_until(written, 10, "the server's stat rows count every success")

    started, succeeded, retried, failed, rows = serve(body, workers=2)
    total = plain + partitioned
    assert (started, succeeded, retried, failed) == (total, total, 0, 0)
    assert rows >= 1
    server_ids = {
        r[0] for r in later_db.rows("SELECT DISTINCT server_id FROM later_dashboard_stat")
    }
    assert len(server_ids) == 1 and "" not in server_ids

    overview = _json(viewer, f"{BASE}api/overview")
    throughput = overview["throughput"]
    assert throughput["stage_changes"] == 2 * total > 0
    assert sum(throughput["series"]) == throughput["stage_changes"]
    assert len(throughput["series"]) == throughput["window_seconds"] == 60
    assert (throughput["started"], throughput["succeeded"]) == (total, total)
    assert (throughput["retried"], throughput["failed"]) == (0, 0)
    waits = overview["waits"]
    assert waits["regular"]["count"] == plain
    assert waits["partitioned"]["count"] == partitioned
    for lane in ("regular", "partitioned"):
        figures = waits[lane]
        assert 0 <= figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert overview["counts"]["success"] == total


def test_a_stopping_server_writes_the_figures_since_its_last_flush(
    later_db: LaterDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "FLUSH_INTERVAL", 3600)  # no flush while up
    jobs = 6

    async def body(server: Server) -> None:
        await in_thread(lambda: later.enqueue_many(Noop(n=i) for i in range(jobs)))

        async def all_done() -> bool:
            counts = await in_thread(later.stage_counts)
            return counts["success"] == jobs

        await await_until(all_done, 10, "every job succeeded")
        assert await in_thread(later_db.job_count) == jobs
        rows = await in_thread(later_db.scalar, "SELECT COUNT(*) FROM later_dashboard_stat")
        assert rows == 0, "nothing flushed while the server runs"

    serve(body, workers=2)
    rows = later_db.rows("SELECT started, succeeded, retried, failed FROM later_dashboard_stat")
    assert rows == [(jobs, jobs, 0, 0)]


# -- the leader's samples of the backlog ------------------------------------------------
def _step_context(alias: str) -> StepContext:
    return StepContext(
        alias=alias,
        namespace="default",
        retention_ms=60_000,
        stuck_grace_ms=1000,
        server_ttl_ms=60_000,
        vacuum_interval_ms=None,
        leader=Leader(namespace="default", owner="test-leader", ttl_ms=30_000),
        missed_grace_ms=60_000,
        schedule_ahead_ms=1000,
    )


def _sample_once(later_db: LaterDb) -> int:
    with connections[later_db.alias].cursor() as cursor:
        return sample_queue(dialect_for(later_db.alias), cursor, _step_context(later_db.alias))


SAMPLE_COLUMNS = "ready, scheduled, running, waiting, partitioned"


def test_one_sample_a_minute_with_the_counters_values(later_db: LaterDb, settings: Any) -> None:
    set_later(settings, TOPICS={"ordered": 2})
    later.enqueue_many(Noop(n=i) for i in range(4))  # ready
    delayed = [later.enqueue_delayed(Noop(n=i), HOUR) for i in range(2)]
    requeued = later.enqueue_delayed(Noop(n=9), HOUR)
    later_db.execute("UPDATE later_job SET stage = 'requeued' WHERE id = %s", [requeued])
    for n in range(3):
        later.enqueue_continue(delayed[0], Noop(n=20 + n))  # waiting
    later.enqueue_to_partition(Ordered("k", 0))
    later.enqueue_to_partition_delayed(Ordered("k", 1), HOUR)
    running = later.enqueue(Noop(n=30), priority=9)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        claimed = dialect_for(later_db.alias).hot.claim(
            c, ClaimRequest(namespace="default", owner="o", limit=1, lease_ms=60_000)
        )
    assert [j.id for j in claimed] == [running]
    later.cancel(later.enqueue(Noop(n=40)))  # finished: in no column

    before = later_db.now_ms()
    assert _sample_once(later_db) == 1
    assert _sample_once(later_db) == 0, "a second run within the minute adds nothing"
    assert _sample_once(later_db) == 0
    samples = later_db.rows(f"SELECT at_ms, {SAMPLE_COLUMNS} FROM later_queue_sample")
    assert len(samples) == 1
    at_ms, *values = samples[0]
    assert before <= at_ms <= later_db.now_ms()
    assert values == [4, 3, 1, 3, 2]
    # The same figures, read from the rows rather than the counters.
    truth = dict(
        later_db.rows(
            "SELECT CASE WHEN topic IS NOT NULL THEN 'partitioned' "
            "WHEN stage IN ('delayed', 'requeued') THEN 'scheduled' "
            "WHEN stage = 'enqueued' THEN 'ready' ELSE stage END, COUNT(*) FROM later_job "
            "WHERE stage NOT IN ('success', 'failed', 'cancelled') GROUP BY 1"
        )
    )
    assert values == [truth.get(k, 0) for k in SAMPLE_COLUMNS.split(", ")]

    # A minute later (the step's last run moved back), the next sample is taken.
    later_db.execute(
        "UPDATE later_maintenance SET last_run_ms = last_run_ms - 60000 WHERE step = 'sample_queue'"
    )
    # The first sample too, or the next one, taken within the same
    # millisecond on a fast machine, would meet its time.
    later_db.execute("UPDATE later_queue_sample SET at_ms = at_ms - 60000")
    later.enqueue(Noop(n=50))
    assert _sample_once(later_db) == 1
    assert _sample_once(later_db) == 0
    rows = later_db.rows(f"SELECT {SAMPLE_COLUMNS} FROM later_queue_sample ORDER BY at_ms")
    assert [list(r) for r in rows] == [[4, 3, 1, 3, 2], [5, 3, 1, 3, 2]]


def test_sampling_prunes_old_figures(later_db: LaterDb) -> None:
    now = later_db.now_ms()
    stat = (
        "INSERT INTO later_dashboard_stat (namespace, server_id, at_ms, started, succeeded, "
        "retried, failed, regular_waits, regular_sum_ms, regular_max_ms, partition_waits, "
        "partition_sum_ms, partition_max_ms) VALUES (%s, 's', %s, 1, 1, 0, 0, '', 0, 0, '', 0, 0)"
    )
    kept_stats = [now - STATS_KEPT_MS + 60_000, now - 1000]
    for at_ms in [now - STATS_KEPT_MS - 60_000, now - 3 * STATS_KEPT_MS, *kept_stats]:
        later_db.execute(stat, ["default", at_ms])
    later_db.execute(stat, ["elsewhere", now - 3 * STATS_KEPT_MS])  # another namespace
    sample = (
        "INSERT INTO later_queue_sample (namespace, at_ms, ready, scheduled, running, waiting, "
        "partitioned) VALUES (%s, %s, 1, 0, 0, 0, 0)"
    )
    kept_samples = [now - SAMPLES_KEPT_MS + 3_600_000, now - 60_000]
    for at_ms in [now - SAMPLES_KEPT_MS - 3_600_000, now - 30 * 86_400_000, *kept_samples]:
        later_db.execute(sample, ["default", at_ms])

    assert _sample_once(later_db) == 1
    stats = later_db.rows("SELECT namespace, at_ms FROM later_dashboard_stat ORDER BY at_ms")
    assert stats == [("elsewhere", now - 3 * STATS_KEPT_MS)] + [("default", t) for t in kept_stats]
    samples = [
        int(r[0]) for r in later_db.rows("SELECT at_ms FROM later_queue_sample ORDER BY at_ms")
    ]
    assert samples[:2] == kept_samples and len(samples) == 3  # and the one just taken
    assert samples[2] >= now


def test_the_maintenance_tick_takes_the_sample(later_db: LaterDb) -> None:
    later.enqueue_many(Noop(n=i) for i in range(3))

    async def main() -> list[tuple[object, ...]]:
        server = Server(workers=1)
        try:
            for _ in range(3):
                results = await server.maintenance.run_once()
                assert not isinstance(results["sample_queue"], BaseException), results
            return await in_thread(
                later_db.rows, f"SELECT {SAMPLE_COLUMNS} FROM later_queue_sample"
            )
        finally:
            await server.shutdown(1)

    assert asyncio.run(main()) == [(3, 0, 0, 0, 0)]


# -- the queue-length graph's endpoint ----------------------------------------------------------
def test_the_samples_endpoint_thins_a_range_to_at_most_360_points(
    later_db: LaterDb, viewer: Client
) -> None:
    now = later_db.now_ms()
    rng = random.Random(5)
    day = reads.SAMPLE_RANGES["24h"]
    # Every 86 s over the last day: 1004 samples; then older ones, outside the range.
    rows = [
        (now - day + 60_000 + i * 86_000, rng.randrange(0, 1000), rng.randrange(0, 50), i % 7, 0, i)
        for i in range(1004)
    ]
    rows += [(now - day - 60_000 * (i + 1), 99_999, 0, 0, 0, 0) for i in range(30)]
    with connections[later_db.alias].cursor() as cursor:
        cursor.executemany(
            "INSERT INTO later_queue_sample (namespace, at_ms, ready, scheduled, running, "
            "waiting, partitioned) VALUES ('default', %s, %s, %s, %s, %s, %s)",
            rows,
        )
    in_day = sorted(r for r in rows if r[0] >= now - day)

    data = _json(viewer, f"{BASE}api/samples?range=24h")
    assert data["range"] == "24h"
    assert data["columns"] == ["at_ms", "ready", "scheduled", "running", "waiting", "partitioned"]
    points = data["points"]
    assert 0 < len(points) <= reads.SAMPLE_POINTS
    times = [p[0] for p in points]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert times[0] >= now - day and times[-1] == in_day[-1][0]
    # Thinned by keeping each stretch's largest value: no peak is lost, none made up.
    for column in range(1, 6):
        assert max(p[column] for p in points) == max(r[column] for r in in_day)
    assert all(p[1] != 99_999 for p in points), "samples older than the range are left out"

    hour = _json(viewer, f"{BASE}api/samples?range=1h")
    recent = [list(r) for r in in_day if r[0] >= now - reads.SAMPLE_RANGES["1h"]]
    assert hour["points"] == recent, "a range with fewer samples is shown whole"
    week = _json(viewer, f"{BASE}api/samples?range=7d")
    assert len(week["points"]) <= reads.SAMPLE_POINTS
    assert max(p[1] for p in week["points"]) == 99_999
    assert _json(viewer, f"{BASE}api/samples")["range"] == "24h"

    bad = viewer.get(f"{BASE}api/samples?range=2w")
    assert bad.status_code == 400
    assert bad["Content-Type"] == "application/json"
    assert json.loads(bad.content) == {"error": "unknown range '2w': use one of 1h, 24h, 7d"}
