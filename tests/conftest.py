"""Test fixtures: every storage test runs once on SQLite and once on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connections

from later_django.db.base import TABLES
from tests.helpers import LaterDb, Workers

# later_drain and later_inline, enabled the way docs/how-to/testing.md tells users to;
# the browser and page fixtures of the real-browser tests (tests/browser.py).
pytest_plugins = ["later_django.testing.pytest_plugin", "tests.browser"]

ALIASES = {"sqlite": "default", "postgresql": "pg"}
LATER_TABLES = TABLES  # later_job first: deleting jobs fires the counter triggers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Storage tests commit for real (workers in other processes must see the
    # rows), so they run in transactional mode on every configured database.
    databases = sorted(django_settings.DATABASES)
    for item in items:
        if "later_db" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "django_db"
        ):
            item.add_marker(pytest.mark.django_db(transaction=True, databases=databases))


@pytest.fixture(params=sorted(ALIASES), ids=sorted(ALIASES))
def later_db(request: pytest.FixtureRequest, settings: object) -> LaterDb:
    vendor = request.param
    alias = ALIASES[vendor]
    if alias not in django_settings.DATABASES:
        pytest.skip("no PostgreSQL server could be started (set LATER_TEST_POSTGRES_URL)")
    settings.LATER = {**django_settings.LATER, "DATABASE": alias}  # type: ignore[attr-defined]
    with connections[alias].cursor() as cursor:
        # Jobs first: deleting them fires the counter triggers.
        for table in LATER_TABLES:
            cursor.execute(f"DELETE FROM {table}")
    return LaterDb(alias=alias, vendor=vendor)


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the test handlers append a line to per run (tests/jobapp/jobs.py)."""
    path = tmp_path / "record.txt"
    monkeypatch.setenv("LATER_TEST_RECORD", str(path))
    return path


@pytest.fixture
def workers(later_db: LaterDb, tmp_path: Path) -> Iterator[Workers]:
    """Starts ``later_worker`` processes for one test and always stops them."""
    pool = Workers(later_db, tmp_path)
    try:
        yield pool
    finally:
        pool.stop_all()
