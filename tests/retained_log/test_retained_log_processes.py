"""The retained log across real processes, on both databases: concurrent
appenders get gapless offsets, and a consumer killed before it commits
leaves its records to the next owner."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from later_django import retained_log as log
from tests.helpers import PROJECT_DIR, set_later, wait_until
from tests.jobapp.log_processes import SINGLE

pytestmark = [pytest.mark.slow, pytest.mark.one_env]

APPENDERS = 4
PER_APPENDER = 5_000
TOPIC = "events"


def start(later_db, argv: list[str], log_path: Path, **env: str) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *argv],
            cwd=PROJECT_DIR,
            env={**later_db.worker_env(), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def read_all(partition: int) -> list[log.Record]:
    records: list[log.Record] = []
    while batch := log.read(TOPIC, partition, len(records), 10_000):
        records += batch
    return records


def test_concurrent_appenders_get_gapless_offsets_and_replay_is_exact(later_db, tmp_path):
    """4 processes x 5,000 records (the first 500 of each appended one by one,
    the rest in batches), all at once: per partition the offsets are 0..n-1
    with no gap or duplicate, each process's records of a partition keep its
    order, and reading back returns exactly what was appended."""
    log.register_topic(TOPIC, partitions=3)
    go = tmp_path / "go"
    procs = [
        start(
            later_db,
            [
                "-m",
                "tests.jobapp.log_processes",
                "append",
                str(i),
                str(PER_APPENDER),
                str(tmp_path / f"out-{i}.json"),
                str(go),
            ],
            tmp_path / f"appender-{i}.log",
        )  # fmt: skip
        for i in range(APPENDERS)
    ]
    try:
        wait_until(
            lambda: all((tmp_path / f"out-{i}.json.ready").exists() for i in range(APPENDERS)),
            60,
            "every appender process to start",
        )
        go.touch()
        for i, proc in enumerate(procs):
            code = proc.wait(120)
            assert code == 0, (tmp_path / f"appender-{i}.log").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    appended: dict[tuple[int, int], bytes] = {}
    for i in range(APPENDERS):
        placed = json.loads((tmp_path / f"out-{i}.json").read_text())
        assert len(placed) == PER_APPENDER
        last: dict[int, int] = defaultdict(lambda: -1)
        for key, partition, offset in placed:
            assert offset > last[partition], f"appender {i} out of order at {key}"
            last[partition] = offset
            assert (partition, offset) not in appended, f"duplicate {(partition, offset)}"
            appended[(partition, offset)] = key.encode()
    assert len(appended) == APPENDERS * PER_APPENDER

    replayed: dict[tuple[int, int], bytes] = {}
    for partition in range(3):
        records = read_all(partition)
        assert [r.offset for r in records] == list(range(len(records)))
        assert all(r.key == r.value for r in records)
        replayed.update({(partition, r.offset): r.value for r in records})
    assert replayed == appended
    # The one-by-one appends of different processes interleaved: in offset
    # order, the appender changes more often than once per process.
    singles = [
        key.split(b"-")[0]
        for _, key in sorted(appended.items())
        if int(key.split(b"-")[1]) < SINGLE
    ]
    changes = sum(1 for a, b in zip(singles, singles[1:], strict=False) if a != b)
    assert changes > 3 * APPENDERS


def test_a_consumer_killed_before_it_commits_leaves_its_records_to_the_next_owner(
    later_db, tmp_path, settings
):
    """``later_consume`` commits after each batch of 4; SIGKILLed while handling
    the second batch, its lease runs out, and the next member starts from the
    last committed offset: the records it handled but did not commit come
    again (at least once), none is skipped."""
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"hang" if n == 6 else b"ok") for n in range(10)])
    record = tmp_path / "handled.txt"
    proc = start(
        later_db,
        ["-m", "django", "later_consume", TOPIC, "--group", "billing", "--member", "first",
         "--handler", "tests.jobapp.log_processes.record_then_hang", "--batch-size", "4"],
        tmp_path / "consumer.log",
        LATER_TEST_RECORD=str(record),
        LATER_TEST_TIMINGS=json.dumps({"RETAINED_LOG_LEASE_DURATION": 1}),
    )  # fmt: skip
    try:
        wait_until(
            lambda: record.exists() and record.read_text().endswith("0 6\n"),
            30,
            lambda: f"the consumer to reach offset 6: {(tmp_path / 'consumer.log').read_text()}",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert record.read_text().split("\n")[:-1] == [f"0 {n}" for n in range(7)]
    assert log.lag(TOPIC) == {("billing", 0): 6}

    set_later(settings, RETAINED_LOG_LEASE_DURATION=dt.timedelta(seconds=1))
    lease = wait_until(
        lambda: log.acquire(TOPIC, group="billing", partition=0, member="second"),
        10,
        "the killed consumer's lease to expire",
    )
    assert (lease.epoch, lease.committed_offset) == (2, 4)
    replay = log.read(TOPIC, 0, lease.committed_offset)
    assert [r.offset for r in replay] == list(range(4, 10))
    lease.commit(replay[-1].offset + 1)
    assert log.lag(TOPIC) == {("billing", 0): 0}
