"""Wake-ups for idle workers: PostgreSQL LISTEN, in-process commits, and polling.

A missed or spurious wake-up is harmless: it only changes how soon an idle
worker tries to claim again; the poll interval bounds the worst case.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

from django.db import connections

from later_django import wakeup
from later_django.db.postgresql import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)

LISTEN_RECONNECT_DELAY = 1.0  # seconds between attempts after the listener fails
LISTEN_STOP_CHECK = 0.25  # seconds between checks of the stop flag while listening
DJANGO_ONLY_OPTIONS = {"isolation_level", "pool", "server_side_binding", "assume_role"}


class Wakeup:
    """An event idle workers wait on; ``wake()`` releases every current waiter.

    ``generation`` counts wake-ups, so a worker whose claim was in flight when
    one happened does not sleep through it: it passes the generation it saw
    before claiming as ``since`` and ``wait`` returns at once."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.generation = 0

    def wake(self) -> None:
        self.generation += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float, since: int | None = None) -> None:
        if since is not None and since != self.generation:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


class Notifier:
    """Feeds a Wakeup from LISTEN (PostgreSQL) and from local commits."""

    def __init__(self, wake: Wakeup, *, alias: str, namespace: str, listen: bool) -> None:
        self.wake = wake
        self.alias = alias
        self.namespace = namespace
        self.listen = listen
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        wakeup.add_listener(self._wake_threadsafe)
        if self.listen:
            self._thread = threading.Thread(
                target=self._listen_forever, name="later-listen", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        wakeup.remove_listener(self._wake_threadsafe)
        self._stop.set()

    def join(self, timeout: float) -> None:
        """Wait, after stop(), until the listener thread closed its connection."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _wake_threadsafe(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.wake.wake)

    def _connect_kwargs(self) -> dict[str, Any]:
        settings = connections[self.alias].settings_dict
        options = {
            k: v for k, v in settings.get("OPTIONS", {}).items() if k not in DJANGO_ONLY_OPTIONS
        }
        kwargs = {
            "dbname": settings.get("NAME") or "postgres",
            "user": settings.get("USER") or None,
            "password": settings.get("PASSWORD") or None,
            "host": settings.get("HOST") or None,
            "port": settings.get("PORT") or None,
            **options,
        }
        return {k: v for k, v in kwargs.items() if v is not None}

    def _listen_forever(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(autocommit=True, **self._connect_kwargs()) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.connected.set()
                    # Anything committed while we were not listening is found now.
                    self._wake_threadsafe()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=LISTEN_STOP_CHECK):
                            if note.payload == self.namespace:
                                self._wake_threadsafe()
            except Exception as exc:  # noqa: BLE001  the database may be restarting
                self.connected.clear()
                logger.warning(
                    "LISTEN connection lost (%s); reconnecting; idle workers poll meanwhile",
                    exc,
                    extra={"action": "listen_reconnect"},
                )
                self._stop.wait(LISTEN_RECONNECT_DELAY)
