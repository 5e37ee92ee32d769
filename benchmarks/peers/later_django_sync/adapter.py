"""later_django in the peer harness with a sync handler (``def``, run in the
worker's thread pool): the later_django adapter, its settings and its job,
with ``LBENCH_SYNC=1`` set for itself and the workers it starts."""

from __future__ import annotations

import os
import sys

ASYNC_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "later_django")
)
os.environ["LBENCH_SYNC"] = "1"
# The settings module, the lbench app and the adapter loader live beside the
# async adapter.
sys.path.insert(0, ASYNC_DIR)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ASYNC_DIR, os.environ.get("PYTHONPATH")]))

from lbench_peers import sibling_adapter  # noqa: E402  found through ASYNC_DIR


class Adapter(sibling_adapter("later_django")):  # type: ignore[misc]  a base loaded by path
    name = "later_django_sync"
    worker_note = (
        "1 `manage.py later_worker --workers N` process (N asyncio workers, sync "
        "no-op handler run in the worker's thread pool), LISTEN/NOTIFY wake-ups, --verbosity 0"
    )
