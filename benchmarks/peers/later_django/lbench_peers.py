"""Load the adapter of another later_django peer folder, so that a variant
(a sync handler, ``--processes``) subclasses it instead of copying it.

The harness runs every peer folder where it is, with that folder on the
import path; the later_django folders sit side by side, so a variant finds
its base one level up. Each folder's module is ``adapter.py``, the same name
in all of them, so it is loaded by its path, not imported by name.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

PEERS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sibling_adapter(folder: str) -> Any:
    """Return the ``Adapter`` class of the peer folder ``folder`` beside this one."""
    spec = importlib.util.spec_from_file_location(
        f"{folder}_adapter", os.path.join(PEERS_DIR, folder, "adapter.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Adapter
