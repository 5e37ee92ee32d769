"""The LISTEN connection: commits of ready jobs, as PostgreSQL announces them.

The job triggers NOTIFY the channel with the job's namespace when a job
becomes ready; NOTIFY is transactional, so a notification arrives only
after the commit. The connection is an asyncio one, in the worker's event
loop itself: a notification wakes workers without passing through a thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from later_django.db.postgresql import NOTIFY_CHANNEL, PARTITION_CHANNEL, connect_kwargs


async def notifications(
    alias: str, *, partitions: bool = False
) -> AsyncIterator[tuple[str, str] | None]:
    """Listen on ``alias``: yield None once listening, then (channel,
    payload) of each notification; partition jobs' channel too with
    ``partitions``. Ends with the connection's error, if it fails."""
    import psycopg

    conn = await psycopg.AsyncConnection.connect(autocommit=True, **connect_kwargs(alias))
    async with conn:
        await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        if partitions:
            await conn.execute(f"LISTEN {PARTITION_CHANNEL}")
        yield None
        async for note in conn.notifies():
            yield note.channel, note.payload
