"""later_django in the peer harness with a sync handler on every core:
``later_worker --processes auto``, the total concurrency spread over one
server process per core. The sync adapter (beside this folder, itself
beside the async one), with ``LBENCH_PROCESSES=auto`` set for itself and
the workers it starts."""

from __future__ import annotations

import os
import sys

os.environ["LBENCH_PROCESSES"] = "auto"
# The adapter loader lives beside the async adapter.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "later_django")
)

from lbench_peers import sibling_adapter


class Adapter(sibling_adapter("later_django_sync")):  # type: ignore[misc]  a base loaded by path
    name = "later_django_processes"
    worker_note = (
        "1 `manage.py later_worker --processes auto --workers N/cores` (one server "
        "process per core, sync no-op handler run in each one's thread pool), "
        "LISTEN/NOTIFY wake-ups, --verbosity 0"
    )
