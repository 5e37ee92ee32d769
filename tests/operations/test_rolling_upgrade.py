"""A rolling upgrade (docs/how-to/upgrading.md): the previous release's
``later_worker`` runs beside this release's on a database this release
migrated, on SQLite and on PostgreSQL. Jobs enqueued by either release's
code run exactly once, and both servers' heartbeats are seen, the previous
release's without a version."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from django.db import transaction

import later_django as later
from tests.helpers import (
    PROJECT_DIR,
    WORKER_ARGS,
    WorkerProcess,
    read_records,
    set_later,
    wait_until,
)
from tests.jobapp.jobs import Noop, Ordered
from tests.order_check import checked_pairs, order_violations, stored_runs

# later_worker processes: Django's version changes nothing here (tox.ini).
pytestmark = [pytest.mark.slow, pytest.mark.one_env]

# The previous release: the commit this release's changes to the database
# (0018_partition_news, 0019_server_version, 0020_sqlite_counts_in_place)
# were made on, i.e. the newest code that ran without them. A fixed commit,
# not HEAD~1 (which moves with every commit) nor a tag (a clone may lack
# it): every clone with history has it. When a release
# after this one changes the schema again, its branch point replaces it.
PREVIOUS_RELEASE = "d2c50aa"
JOBS_PER_RELEASE = 300


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's later_django and tests packages, from git."""
    git = shutil.which("git")
    if git is None:
        pytest.fail("this test needs git: it takes the previous release's code from git history")
    found = subprocess.run(
        [git, "-C", str(PROJECT_DIR), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"commit {PREVIOUS_RELEASE} is not in this clone's history (a shallow clone? "
            f"`git fetch --unshallow`): {found.stderr.decode().strip()}"
        )
    archive = subprocess.run(
        [git, "-C", str(PROJECT_DIR), "archive", "--format=tar", PREVIOUS_RELEASE],
        capture_output=True,
        check=True,
    )
    root = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    assert (root / "later_django" / "migrations" / "0017_fan_in.py").exists()
    assert not (root / "later_django" / "migrations" / "0019_server_version.py").exists()
    return root


def previous_env(later_db, root: Path, record: Path) -> dict[str, str]:
    """The environment of a process that runs the previous release's code:
    its tree first on PYTHONPATH (and as the working directory, which
    ``python -m`` and ``-c`` put before it)."""
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {**later_db.worker_env(), "LATER_TEST_RECORD": str(record), "PYTHONPATH": path}


def start_previous(workers, root: Path, env: dict[str, str]) -> WorkerProcess:
    """A later_worker of the previous release's code (4 workers), stopped by
    the ``workers`` fixture too."""
    log = workers.tmp_path / "previous-worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*WORKER_ARGS, "--workers", "4"],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    previous = WorkerProcess(proc, log)
    workers.started.append(previous)
    return previous


def test_previous_release_worker_runs_beside_this_one(later_db, workers, previous_release):
    """Both releases' workers serve one database migrated by this release:
    jobs enqueued by either release's code each run exactly once, both
    servers share them, and later_health sees both heartbeats, the previous
    release's version unrecorded (NULL)."""
    env = previous_env(later_db, previous_release, workers.record)
    previous = start_previous(workers, previous_release, env)
    current = workers.start(workers=4)
    workers.wait_registered(previous, current)

    versions = dict(later_db.rows("SELECT pid, version FROM later_server"))
    assert versions == {previous.pid: None, current.pid: later.__version__}

    enqueue_previous = (
        "import django; django.setup(); import later_django as later; "
        "from tests.jobapp.jobs import Noop; "
        f"ids = later.enqueue_many(Noop(n=n) for n in range({JOBS_PER_RELEASE - 1})); "
        "ids.append(later.enqueue(Noop(n=-1))); print(' '.join(ids))"
    )
    ids_previous = subprocess.run(
        [sys.executable, "-c", enqueue_previous],
        cwd=previous_release,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    ids_current = [
        *later.enqueue_many(Noop(n=n) for n in range(JOBS_PER_RELEASE - 1)),
        later.enqueue(Noop(n=-1)),
    ]
    ids = ids_previous + ids_current
    assert len(set(ids)) == 2 * JOBS_PER_RELEASE
    wait_until(
        lambda: later.stage_counts()["success"] == len(ids),
        60,
        lambda: f"every job succeeds; counts {later.stage_counts()}\n{workers.logs()}",
    )

    runs = Counter(r.job_id for r in read_records(workers.record, "noop"))
    assert set(runs) == set(ids)
    assert set(runs.values()) == {1}, "each job ran exactly once"
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE attempts <> 1") == 0
    pids = Counter(r.pid for r in read_records(workers.record, "noop"))
    assert set(pids) == {previous.pid, current.pid}, f"both servers ran jobs: {pids}"

    health = subprocess.run(
        [*WORKER_ARGS[:-1], "later_health", "--deep"],
        cwd=PROJECT_DIR,
        env=later_db.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert health.returncode == 0, health.stdout + health.stderr
    assert (
        f"; fleet: 2 servers live, versions {later.__version__} (1), unrecorded (1); "
        "counters match the rows; "
    ) in health.stdout

    assert previous.stop() == 0, previous.output()
    assert current.stop() == 0, current.output()
    assert later_db.scalar("SELECT COUNT(*) FROM later_server") == 0, "both deregistered"


def test_previous_release_worker_keeps_partition_order_beside_this_one(
    later_db, workers, previous_release, settings
):
    """Partition jobs on a database whose notifications name the partition
    (0018): the previous release's server, which reads only the bare
    namespace, and this release's, which reads the partition, share the
    partitions; every job runs once, in order per key."""
    topic_env = {"LATER_TEST_SETTINGS": json.dumps({"TOPICS": {"ordered": 8}})}
    set_later(settings, TOPICS={"ordered": 8})
    env = {**previous_env(later_db, previous_release, workers.record), **topic_env}
    previous = start_previous(workers, previous_release, env)
    current = workers.start(workers=4, env=topic_env)
    workers.wait_registered(previous, current)
    keys, per_key = 16, 15
    with transaction.atomic(using=later_db.alias):
        for n in range(per_key):
            for k in range(keys):
                later.enqueue_to_partition_in(Ordered(f"key-{k}", n))
    total = keys * per_key
    wait_until(
        lambda: later.stage_counts()["success"] == total,
        60,
        lambda: f"every partition job succeeds; counts {later.stage_counts()}\n{workers.logs()}",
    )
    finished = dict(later_db.rows("SELECT id, attempts FROM later_job"))
    runs = stored_runs(workers.record, {str(k): int(v) for k, v in finished.items()})
    assert order_violations(runs) == []
    assert checked_pairs(runs) == total - keys
    starts = read_records(workers.record, "ordered-start")
    assert len(starts) == total, "each partition job ran once"
    assert {r.pid for r in starts} == {previous.pid, current.pid}, "both servers ran heads"
    assert previous.stop() == 0, previous.output()
    assert current.stop() == 0, current.output()
