"""SQL of ``later_topic``: registered topics and their partition counts."""

from __future__ import annotations

from typing import Final

TOPIC_PARTITIONS_SQL: Final = "SELECT name, partitions FROM later_topic WHERE namespace = %s"

TOPIC_REGISTER_SQL: Final = (
    "INSERT INTO later_topic (namespace, name, partitions) VALUES (%s, %s, %s) "
    "ON CONFLICT (namespace, name) DO NOTHING"
)
