"""Sequential partition mode across real ``later_worker`` processes: order
under kills, pauses and failures, ownership moves, and the fence of a
partition's epoch (docs/how-to/partitions.md).

The order test's size is CI's; ``LATER_ORDER_JOBS=200`` runs the full
acceptance size (50 keys x 200 jobs): docs/how-to/partitions.md has the figures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from django.db import connections, transaction

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import PartitionClaimRequest, PartitionCompletion
from later_django.partitions.hashing import owner_of
from later_django.types import PartitionLane
from later_django.worker.executor import Outcome
from later_django.worker.outcome_writes import store_partition_outcome
from tests.helpers import LaterDb, Workers, set_later, wait_until
from tests.jobapp.jobs import Ordered
from tests.order_check import checked_pairs, order_violations, stored_runs

pytestmark = [pytest.mark.slow, pytest.mark.one_env]

TOPICS = {"ordered": 8}
# Short leases so a killed or paused process's partitions move within seconds.
TIMINGS = {
    "LEASE_DURATION": 2.0,
    "STUCK_JOB_GRACE": 0.5,
    "PARTITION_LEASE_DURATION": 2.0,
    "PARTITION_HEARTBEAT_TTL": 2.0,
    "PARTITION_HEARTBEAT_INTERVAL": 0.3,
}
TOPIC_ENV = {"LATER_TEST_SETTINGS": json.dumps({"TOPICS": TOPICS})}
KEYS = 50
JOBS_PER_KEY = int(os.environ.get("LATER_ORDER_JOBS", "20"))


@pytest.fixture
def topics(later_db: LaterDb, settings: object) -> LaterDb:
    set_later(settings, TOPICS=TOPICS)
    return later_db


def enqueue_ordered(
    alias: str, keys: int, per_key: int, *, fail_rate: float, seconds: float = 0.0
) -> int:
    """Enqueue ``per_key`` jobs for each key, interleaved, in batches of one
    transaction; return how many."""
    rng = random.Random(12)
    payloads = [
        Ordered(f"key-{k}", n, seconds=seconds, fail_first=rng.random() < fail_rate)
        for n in range(per_key)
        for k in range(keys)
    ]
    for start in range(0, len(payloads), 500):
        with transaction.atomic(using=alias):
            for payload in payloads[start : start + 500]:
                later.enqueue_to_partition_in(payload)
    return len(payloads)


def count(later_db: LaterDb, stage: str) -> int:
    return int(later_db.scalar("SELECT count(*) FROM later_job WHERE stage = %s", [stage]))  # type: ignore[arg-type]


def final_attempts(later_db: LaterDb) -> dict[str, int]:
    rows = later_db.rows("SELECT id, attempts FROM later_job WHERE stage = 'success'")
    return {str(job_id): int(attempts) for job_id, attempts in rows}  # type: ignore[call-overload]


def successes_written_once(later_db: LaterDb) -> bool:
    histories = later_db.rows("SELECT history FROM later_job")
    return all(str(h).count("success@") == 1 for (h,) in histories)


def test_order_holds_across_three_processes_with_failures_and_a_kill(topics, workers: Workers):
    total = enqueue_ordered(topics.alias, KEYS, JOBS_PER_KEY, fail_rate=0.1, seconds=0.001)
    procs = [workers.start(timings=TIMINGS, workers=8, env=TOPIC_ENV) for _ in range(3)]
    workers.wait_registered(*procs)
    wait_until(lambda: count(topics, "success") >= total // 3, 120, workers.logs)
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].proc.wait()
    procs.append(workers.start(timings=TIMINGS, workers=8, env=TOPIC_ENV))
    wait_until(
        lambda: count(topics, "success") == total,
        180,
        lambda: f"{later.stage_counts()}\n{workers.logs()[-6000:]}",
    )
    runs = stored_runs(workers.record, final_attempts(topics))
    assert order_violations(runs) == []
    # Every job's success, plus every stored failure, was compared with its neighbour.
    assert checked_pairs(runs) >= total - KEYS
    assert successes_written_once(topics)


def running_owner_pid(later_db: LaterDb) -> int | None:
    rows = later_db.rows(
        "SELECT s.pid FROM later_job j JOIN later_server s ON s.id = j.lease_owner "
        "WHERE j.stage = 'running'"
    )
    return int(rows[0][0]) if rows else None  # type: ignore[call-overload]


def test_a_paused_process_loses_its_partitions_and_its_writes(topics, workers: Workers):
    # Slow heads, so the paused process is inside handlers when it stops.
    total = enqueue_ordered(topics.alias, 8, 6, fail_rate=0.0, seconds=0.3)
    procs = [workers.start(timings=TIMINGS, workers=4, env=TOPIC_ENV) for _ in range(2)]
    workers.wait_registered(*procs)
    # Pause a process while it runs a head.
    owner_pid = wait_until(lambda: running_owner_pid(topics), 60, workers.logs)
    paused = next(proc for proc in procs if proc.pid == owner_pid)
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        # Past its job and partition leases: the other process takes over.
        time.sleep(TIMINGS["LEASE_DURATION"] * 3)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    wait_until(lambda: count(topics, "success") == total, 120, workers.logs)
    runs = stored_runs(workers.record, final_attempts(topics))
    assert order_violations(runs) == []
    assert successes_written_once(topics)
    # Whatever the paused process ran under a lease it lost was stopped or
    # discarded, never stored.
    wait_until(
        lambda: (
            "its outcome was discarded" in paused.output()
            or "cancelled handler" in paused.output()
            or "abandoned sync handler" in paused.output()
        ),
        30,
        paused.output,
    )


def claim_request(lane: PartitionLane, owner: str, lease_ms: int) -> PartitionClaimRequest:
    return PartitionClaimRequest(
        lane=lane, owner=owner, partition_lease_ms=lease_ms, job_lease_ms=60_000, server_ttl_ms=1
    )


def test_a_stale_epoch_cannot_finish_a_head(topics):
    """The fence itself: a holder whose partition lease was taken over (a
    higher epoch) cannot store its head's outcome, even with its job lease."""
    job_id = later.enqueue_to_partition(Ordered("k", 0))
    lane = PartitionLane("default", "ordered", later.get_job(job_id).partition)
    dialect = dialect_for(topics.alias)
    db = connections[topics.alias]
    with transaction.atomic(using=topics.alias), db.cursor() as c:
        epoch, job = dialect.partitions.partition_claim(c, claim_request(lane, "a", 1))
    assert job is not None and job.lane.epoch == epoch
    time.sleep(0.01)  # a's partition lease (1 ms) expired
    with transaction.atomic(using=topics.alias), db.cursor() as c:
        taken = dialect.partitions.partition_claim(c, claim_request(lane, "b", 60_000))
    assert taken is not None and taken[0] == epoch + 1
    assert taken[1] is None  # the head still runs under a's job lease: b waits
    with transaction.atomic(using=topics.alias), db.cursor() as c:
        done = PartitionCompletion(job=job, owner="a", retention_ms=60_000)
        assert dialect.partitions.partition_complete(c, done) is False
    with transaction.atomic(using=topics.alias), db.cursor() as c:
        failed = Outcome(kind="failed", error="boom")
        stored = store_partition_outcome(dialect, c, job, failed, owner="a", retention_ms=60_000)
    assert stored is None
    assert topics.stage_of(job_id) == "running"


def test_adding_a_server_moves_only_the_partitions_it_wins():
    partitions = [("ordered", p) for p in range(64)]
    before = {key: owner_of("default", *key, ["s1", "s2", "s3"]) for key in partitions}
    after = {key: owner_of("default", *key, ["s1", "s2", "s3", "s4"]) for key in partitions}
    moved = [key for key in partitions if before[key] != after[key]]
    assert moved and all(after[key] == "s4" for key in moved)
    assert 64 / 4 * 0.5 < len(moved) < 64 / 4 * 1.6


def owners(later_db: LaterDb) -> dict[int, str | None]:
    rows = later_db.rows("SELECT partition, owner FROM later_partition WHERE lease_expires_ms > 0")
    return {int(p): (None if o is None else str(o)) for p, o in rows}  # type: ignore[call-overload]


def server_ids(later_db: LaterDb) -> dict[int, str]:
    return {int(pid): str(sid) for sid, pid in later_db.rows("SELECT id, pid FROM later_server")}  # type: ignore[call-overload]


def test_partitions_move_to_a_new_server_and_back_from_a_stopped_one(topics, workers: Workers):
    # A head in every partition keeps every partition's lease held.
    enqueue_ordered(topics.alias, 40, 1, fail_rate=0.0)
    timings = {**TIMINGS, "PARTITION_HEARTBEAT_TTL": 30.0, "PARTITION_LEASE_DURATION": 30.0}
    first = workers.start(timings=timings, workers=2, env=TOPIC_ENV)
    workers.wait_registered(first)
    wait_until(lambda: count(topics, "success") == 40, 60, workers.logs)
    first_id = server_ids(topics)[first.pid]
    wait_until(lambda: set(owners(topics).values()) == {first_id}, 30, lambda: str(owners(topics)))
    second = workers.start(timings=timings, workers=2, env=TOPIC_ENV)
    workers.wait_registered(second)
    second_id = server_ids(topics)[second.pid]
    expected = {p: owner_of("default", "ordered", p, [first_id, second_id]) for p in range(8)}
    kept = {p: owner for p, owner in expected.items() if owner == first_id}
    # The first server lets go of what the second now wins, and only that...
    wait_until(lambda: owners(topics) == kept, 10, lambda: f"{owners(topics)} != {kept}")
    # ...which the second takes with its first heads there.
    enqueue_ordered(topics.alias, 40, 1, fail_rate=0.0)
    wait_until(
        lambda: owners(topics) == expected,
        30,
        lambda: (
            f"{owners(topics)} != {expected}\n"
            f"{topics.rows('SELECT * FROM later_partition')}\n"
            f"{topics.rows('SELECT partition, stage FROM later_job')}"
            f"\n{workers.logs()[-5000:]}"
        ),
    )
    # A graceful stop hands its partitions over long before its 30 s heartbeat
    # and lease would expire.
    stopped_at = time.monotonic()
    assert second.stop() == 0
    enqueue_ordered(topics.alias, 40, 1, fail_rate=0.0)
    wait_until(lambda: set(owners(topics).values()) == {first_id}, 10, lambda: str(owners(topics)))
    assert time.monotonic() - stopped_at < 10
    wait_until(lambda: count(topics, "success") == 120, 30, workers.logs)
