"""The example project's ``manage.py demo`` runs end to end, on a database of
its own, and ends with hints a user can follow as printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PROJECT_DIR

pytestmark = [pytest.mark.slow, pytest.mark.one_env]


def manage_py(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the example project's manage.py from the repository root."""
    return subprocess.run(
        [sys.executable, "example_project/manage.py", *args],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_hint_names_the_python_it_ran_with(tmp_path: Path):
    """The last hint runs manage.py with the demo's own interpreter (relative
    to the current directory when under it), not whatever ``python`` is on
    PATH, and names manage.py as seen from there too."""
    (tmp_path / "demo_settings.py").write_text(
        "from example_project.settings import *  # noqa: F403\n\n"
        f'DATABASES["default"]["NAME"] = {str(tmp_path / "shop.sqlite3")!r}  # noqa: F405\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # SQLite, not PostgreSQL
    env |= {"DJANGO_SETTINGS_MODULE": "demo_settings", "PYTHONPATH": str(tmp_path)}
    for args in (["later_migrate"], ["migrate", "-v0"], ["demo"]):
        result = manage_py(env, *args)
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"

    last = result.stdout.strip().splitlines()[-1]
    executable = Path(sys.executable)
    python = (
        str(executable.relative_to(PROJECT_DIR))
        if executable.is_relative_to(PROJECT_DIR)
        else sys.executable
    )
    assert last == (
        f"  see it live: {python} example_project/manage.py createsuperuser, "
        f"{python} example_project/manage.py runserver, "
        "then http://127.0.0.1:8000/admin/later/"
    )
