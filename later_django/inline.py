"""LATER["RUN_INLINE"]: run jobs in the enqueuing process when their enqueue
commits, with no worker (for tests and local development).

The enqueue is the real one; this module listens to the in-process wake-up
of a commit (later_django.wakeup) and runs later_django.testing's drain().
Off, it does not listen, so an enqueue pays nothing, and the runner is
imported only when a job is to run.
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from later_django import wakeup
from later_django.conf import conf


def _run(count: int | None) -> None:
    from later_django.testing import runner

    # A job enqueued by a handler that drain() is running is taken by that
    # drain's next claim.
    if not runner.draining():
        runner.drain()


def sync_with_settings() -> None:
    """Listen for commits exactly when LATER["RUN_INLINE"] is True."""
    if conf.raw().get("RUN_INLINE") is True:
        wakeup.add_listener(_run)
    else:
        wakeup.remove_listener(_run)


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "LATER":
        sync_with_settings()
