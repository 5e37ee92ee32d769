"""Settings for mypy's Django plugin: the test settings without a PostgreSQL server.

mypy ends with os._exit(), so the atexit handler of tests.pgserver never runs
and a throwaway server started while loading tests.settings would outlive it.
A URL that nothing connects to keeps tests.pgserver from starting one.
"""

from __future__ import annotations

import os

os.environ.setdefault("LATER_TEST_POSTGRES_URL", "postgresql://later@127.0.0.1:9/unused")

from tests.settings import *  # noqa: F403
