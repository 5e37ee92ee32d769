"""The conformance suite's fixture: the dialect of the test database."""

from __future__ import annotations

import pytest

from later_django.db import dialect_for
from later_django.db.base import Dialect


@pytest.fixture
def dialect(later_db) -> Dialect:
    return dialect_for(later_db.alias)
