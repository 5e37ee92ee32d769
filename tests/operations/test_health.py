"""``manage.py later_health`` run as a probe runs it: a process of its own,
one line on stdout and an exit status, beside real ``later_worker``
processes, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
from django.core.management import call_command

import later_django as later
from later_django.db.rows import ServerBeat
from later_django.health import _fleet
from tests.helpers import PROJECT_DIR, STOP_TIMEOUT, wait_until
from tests.jobapp.jobs import Noop

# later_worker processes: Django's version changes nothing here (tox.ini).
pytestmark = [pytest.mark.slow, pytest.mark.one_env]

HOST = socket.gethostname()[:255]
# Heartbeats every 0.2 s, live for 1 s: a killed server is silent soon.
# Only where a test waits for that: elsewhere the defaults (every 5 s, live
# for 15 s) keep a busy machine's late heartbeat from failing a test.
FAST_BEATS = {"PARTITION_HEARTBEAT_INTERVAL": 0.2, "PARTITION_HEARTBEAT_TTL": 1.0}


def later_health(
    later_db,
    *args: str,
    timings: dict[str, float] | None = None,
    override: dict[str, object] | None = None,
) -> tuple[int, str]:
    """Run ``later_health`` on the test database; return its exit status and
    its line (it must print exactly one)."""
    env = later_db.worker_env()
    if timings:
        env["LATER_TEST_TIMINGS"] = json.dumps(timings)
    if override:
        env["LATER_TEST_DB_OVERRIDE"] = json.dumps(override)
    result = subprocess.run(
        [sys.executable, "-m", "django", "later_health", *args],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"one line, got {result.stdout!r}; stderr {result.stderr!r}"
    assert result.stderr == ""
    assert result.returncode in (0, 1)
    assert lines[0].startswith("OK: " if result.returncode == 0 else "UNHEALTHY: ")
    return result.returncode, lines[0]


def test_health_is_ok_beside_a_running_worker_and_reports_its_version(later_db, workers):
    """With a later_worker on this host: healthy with --worker, --pid of
    that process and --deep, naming the host's live server and the fleet's
    version; --pid of another process is unhealthy."""
    proc = workers.start(workers=2)
    workers.wait_registered(proc)
    ids = later.enqueue_many(Noop(n=n) for n in range(20))
    for job_id in ids:
        workers.wait_stage(job_id, "success", 30)

    code, line = later_health(later_db, "--worker", "--deep")
    assert code == 0, line
    assert line == (
        f"OK: database {later_db.alias!r} reachable; later's migrations current; "
        f"host {HOST}: 1 server live; fleet: 1 server live, version {later.__version__}; "
        "counters match the rows; every running job has a live lease"
    )
    code, line = later_health(later_db, "--pid", str(proc.pid))
    assert code == 0, line
    assert f"host {HOST} pid {proc.pid}: 1 server live" in line
    code, line = later_health(later_db, "--pid", str(os.getpid()))
    assert code == 1
    assert line.startswith(f"UNHEALTHY: no later_worker server on host {HOST} pid {os.getpid()};")
    assert proc.stop() == 0, proc.output()


def test_health_without_a_server_is_unhealthy_only_when_asked_for_one(later_db):
    """A host that runs no worker (a web host) is healthy, unless --worker
    says this host must run one."""
    code, line = later_health(later_db)
    assert code == 0, line
    assert line == (
        f"OK: database {later_db.alias!r} reachable; later's migrations current; "
        f"no server on host {HOST}; fleet: no live server"
    )
    code, line = later_health(later_db, "--worker")
    assert code == 1
    assert line == (
        f"UNHEALTHY: no later_worker server on host {HOST}; database {later_db.alias!r} "
        "reachable; later's migrations current; fleet: no live server"
    )


def test_health_names_the_silent_server_of_a_worker_killed_with_sigkill(later_db, workers):
    """kill -9 leaves the server's row behind, unrefreshed: once its
    heartbeat is older than PARTITION_HEARTBEAT_TTL, this host is unhealthy
    (with or without --worker), naming the server and its last heartbeat."""
    proc = workers.start(timings=FAST_BEATS, workers=2)
    workers.wait_registered(proc)
    code, line = later_health(later_db, "--worker")
    assert code == 0, line
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.proc.wait(STOP_TIMEOUT) == -signal.SIGKILL
    last_beat = int(later_db.scalar("SELECT MAX(heartbeat_ms) FROM later_server"))  # type: ignore[arg-type]
    wait_until(
        lambda: later_db.now_ms() - last_beat > 1000,
        10,
        "the killed server's heartbeat to be a second old",
    )
    (server_id,) = later_db.rows("SELECT id FROM later_server WHERE pid = %s", [proc.pid])[0]
    for args in (["--worker"], []):
        code, line = later_health(later_db, *args, timings=FAST_BEATS)
        assert code == 1, line
        assert line.startswith(f"UNHEALTHY: host {HOST}: no live server, last heartbeat ")
        assert f"s ago (server {server_id}, pid {proc.pid}); " in line
        assert line.endswith("; fleet: no live server")


def test_health_names_an_unapplied_migration(later_db):
    """A database behind this release's migrations is unhealthy, naming the
    migration and the command that applies it; one ahead of it (a later
    release migrated it, as during a rolling upgrade) is healthy and says so."""
    alias = later_db.alias
    call_command("migrate", "later_django", "0019", database=alias, verbosity=0)
    try:
        code, line = later_health(later_db)
    finally:
        call_command("migrate", "later_django", database=alias, verbosity=0)
    assert code == 1
    assert line == (
        "UNHEALTHY: later's migrations 0020_sqlite_counts_in_place, 0021_rate_window_end are "
        f"not applied on {alias!r}; run `python manage.py later_migrate`; database {alias!r} "
        "reachable"
    )
    later_db.execute(
        "INSERT INTO django_migrations (app, name, applied) VALUES "
        "('later_django', '9999_from_a_later_release', CURRENT_TIMESTAMP)"
    )
    try:
        code, line = later_health(later_db)
    finally:
        later_db.execute("DELETE FROM django_migrations WHERE name = '9999_from_a_later_release'")
    assert code == 0, line
    assert (
        "; later's migrations current (and 9999_from_a_later_release of a later release);" in line
    )


def test_health_deep_names_a_broken_counter_and_a_running_job_nobody_rescues(later_db):
    """--deep compares the stage counters with the rows and looks for
    running jobs whose lease is long expired; without --deep neither is
    looked at."""
    ids = later.enqueue_many(Noop(n=n) for n in range(3))
    code, line = later_health(later_db, "--deep")
    assert code == 0, line
    assert "; counters match the rows; every running job has a live lease" in line

    # The counter of ready jobs says 7 where 3 are (a key's rows replaced by
    # one: PostgreSQL keeps delta rows, SQLite one row per key).
    later_db.execute("DELETE FROM later_stage_count WHERE stage = 'enqueued'")
    later_db.execute(
        "INSERT INTO later_stage_count (namespace, stage, lane, n) "
        "VALUES ('default', 'enqueued', '', 7)"
    )
    code, line = later_health(later_db)
    assert code == 0, "only --deep compares the counters"
    code, line = later_health(later_db, "--deep")
    assert code == 1
    assert line.startswith(
        "UNHEALTHY: stage counters differ from the rows: enqueued counted 7, rows 3; "
    )
    assert line.endswith("; every running job has a live lease")

    # A job claimed by a server that vanished, its lease expired two
    # minutes ago: the rescuer (STUCK_JOB_GRACE + LEASE_DURATION, 60 s by
    # default) should have taken it long since.
    later_db.execute(
        "UPDATE later_job SET stage = 'running', attempts = 1, lease_owner = 'gone-1', "
        "lease_expires_ms = %s WHERE id = %s",
        [later_db.now_ms() - 120_000, ids[0]],
    )
    code, line = later_health(later_db, "--deep")
    assert code == 1
    # Seconds since it expired, as the command saw it: the command starts
    # a second or more after the UPDATE on a busy machine.
    found = re.search(
        rf"; 1 running job\(s\) without a live lease, none rescued: {ids[0]} "
        r"\(lease of gone-1 expired (\d+)s ago\)",
        line,
    )
    assert found is not None, line
    assert 120 <= int(found.group(1)) <= 150


def test_health_on_an_unreachable_database_is_one_line(later_db, tmp_path):
    """A database that cannot be opened is unhealthy, named, in one line."""
    if later_db.vendor == "sqlite":
        overrides: list[dict[str, object]] = [{"NAME": str(tmp_path)}]  # a folder
    else:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        # No such database; and a port nothing listens on any more.
        overrides = [{"NAME": "later_no_such_database"}, {"HOST": "127.0.0.1", "PORT": str(port)}]
    for override in overrides:
        code, line = later_health(later_db, override=override)
        assert code == 1, override
        assert line.startswith(f"UNHEALTHY: cannot reach LATER['DATABASE'] {later_db.alias!r} ("), (
            line
        )


def test_health_fleet_lists_versions_newest_first_then_unrecorded():
    """Release numbers compare as numbers (0.10 after 0.9); servers that
    record none come last; a fleet on one version names it alone."""
    beat = lambda version: ServerBeat("s", "h", 1, version, 0)  # noqa: E731
    fleet = [beat("0.9.0"), beat("0.10.0"), beat(None), beat("0.10.0")]
    assert _fleet(fleet) == "fleet: 4 servers live, versions 0.10.0 (2), 0.9.0 (1), unrecorded (1)"
    assert _fleet([beat(None), beat(None)]) == "fleet: 2 servers live, version unrecorded"
    assert _fleet([beat("1.0")]) == "fleet: 1 server live, version 1.0"
    assert _fleet([]) == "fleet: no live server"
