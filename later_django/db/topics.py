"""Operations on ``later_topic``: registered topics and their partition counts."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.sql import topics as topics_sql
from later_django.db.statements import Statements


class TopicOperations(Statements):
    """Topic registration."""

    def topic_partitions(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, int]:
        """Every topic registered in ``namespace`` and its partition count."""
        cursor.execute(self._sql(topics_sql.TOPIC_PARTITIONS_SQL), [namespace])
        return {str(name): int(count) for name, count in cursor.fetchall()}

    def topic_register(
        self, cursor: CursorWrapper, *, namespace: str, name: str, partitions: int
    ) -> bool:
        """Register a topic unless it exists; return whether it was new."""
        cursor.execute(self._sql(topics_sql.TOPIC_REGISTER_SQL), [namespace, name, partitions])
        return bool(cursor.rowcount == 1)
