"""later_django in the peer harness with a sync handler (``def``, run in the
worker's thread pool): the later_django adapter, its settings and its job,
with ``LBENCH_SYNC=1`` set for itself and the workers it starts."""

from __future__ import annotations

import importlib.util
import os
import sys

ASYNC_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "later_django")
)
os.environ["LBENCH_SYNC"] = "1"
# The settings module and the lbench app live beside the async adapter.
sys.path.insert(0, ASYNC_DIR)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ASYNC_DIR, os.environ.get("PYTHONPATH")]))

_spec = importlib.util.spec_from_file_location(
    "later_django_async_adapter", os.path.join(ASYNC_DIR, "adapter.py")
)
assert _spec is not None and _spec.loader is not None
_async = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_async)


class Adapter(_async.Adapter):  # type: ignore[misc,name-defined]
    name = "later_django_sync"
    worker_note = (
        "1 `manage.py later_worker --workers N` process (N asyncio workers, sync "
        "no-op handler run in the worker's thread pool), LISTEN/NOTIFY wake-ups, --verbosity 0"
    )
