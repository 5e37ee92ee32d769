"""The chaos runner's bounded profile, on SQLite and on PostgreSQL.

Each run starts its own database (the PostgreSQL one with initdb/pg_ctl,
like tests/pgserver.py), three ``later_worker`` processes and a producer,
injects every fault kind at least once and must report 0 lost jobs and no
violation, with partitioned jobs checked for order (pairs compared > 0, 0
violations). See docs/project/chaos.md; the long profile is a documented command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import PROJECT_DIR

CI_TIMEOUT = 300  # the profile takes about a minute; 3 minutes is its budget


def parse_lost(report: str) -> int | None:
    """The ``lost`` number of a printed report."""
    match = re.search(r"^  lost\s+(\d+)", report, re.MULTILINE)
    return int(match.group(1)) if match else None


def parse_order(report: str) -> tuple[int, int] | None:
    """The ``order checks`` line of a printed report: (pairs compared, violations)."""
    match = re.search(r"^order checks\s+(\d+)\s+violations (\d+)", report, re.MULTILINE)
    return (int(match.group(1)), int(match.group(2))) if match else None


def test_parse_order_reads_the_report_line():
    line = "order checks            653   violations 0   (602 partitioned jobs, ...)"
    assert parse_order(f"x\n{line}\ny") == (653, 0)
    assert parse_order("order violations          0   (n/a)") is None


@pytest.mark.slow
@pytest.mark.one_env
@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_chaos_ci_profile_loses_nothing(db, tmp_path):
    # The runner makes its own settings; dev mode's asyncio debugging would
    # slow the workers down against their (short) leases.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CHAOS_", "DJANGO_"))
        and k not in ("PYTHONDEVMODE", "PYTHONASYNCIODEBUG")
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos",
            "--db",
            db,
            "--profile",
            "ci",
            "--seed",
            "7",
            "--workdir",
            str(tmp_path / "chaos"),
        ],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=CI_TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "later chaos report" in output, output[-5000:]
    assert parse_lost(output) == 0, output[-8000:]
    order = parse_order(output)
    assert order is not None and order[0] > 0 and order[1] == 0, output[-8000:]
    assert "RESULT: PASS" in output, output[-8000:]
    assert result.returncode == 0, output[-8000:]
