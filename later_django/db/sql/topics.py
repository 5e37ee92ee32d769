"""SQL of ``later_topic``: registered topics and their partition counts."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Every topic registered in a namespace, and its partition count.
TOPIC_PARTITIONS: Final = Statement(
    "SELECT name, partitions FROM later_topic WHERE namespace = %(namespace)s"
)

# Register a topic unless it exists (a row count of 1 when it was new).
TOPIC_REGISTER: Final = Statement("""
INSERT INTO later_topic (namespace, name, partitions)
VALUES (%(namespace)s, %(name)s, %(partitions)s)
ON CONFLICT (namespace, name) DO NOTHING
""")
