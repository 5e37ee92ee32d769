"""later_django in the peer harness with a sync handler on every core:
``later_worker --processes auto``, the total concurrency spread over one
server process per core. The sync adapter (beside this folder, itself
beside the async one), with ``LBENCH_PROCESSES=auto`` set for itself and
the workers it starts."""

from __future__ import annotations

import importlib.util
import os

SYNC_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "later_django_sync")
)
os.environ["LBENCH_PROCESSES"] = "auto"

_spec = importlib.util.spec_from_file_location(
    "later_django_sync_adapter", os.path.join(SYNC_DIR, "adapter.py")
)
assert _spec is not None and _spec.loader is not None
_sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sync)


class Adapter(_sync.Adapter):  # type: ignore[misc,name-defined]
    name = "later_django_processes"
    worker_note = (
        "1 `manage.py later_worker --processes auto --workers N/cores` (one server "
        "process per core, sync no-op handler run in each one's thread pool), "
        "LISTEN/NOTIFY wake-ups, --verbosity 0"
    )
