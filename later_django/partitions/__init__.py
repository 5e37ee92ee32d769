"""Sequential partition mode: topics whose jobs run one at a time per
partition, in enqueue order (docs/how-to/partitions.md)."""

from __future__ import annotations

from later_django.partitions.hashing import partition_for_key

__all__ = ["partition_for_key"]
