"""Named queues: which exist, which a server serves, and pausing them.

A queue is declared in ``LATER["QUEUES"]``; "default" always exists. A pause
is shared through ``later_queue``, whose row every claim of the queue reads.
The pure rules of queue names are in queue_names.py.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django.conf import conf
from later_django.queue_names import DEFAULT_QUEUE, check_queue_name


def declared() -> tuple[str, ...]:
    """The queues of LATER["QUEUES"], "default" first (it always exists)."""
    names = [name for name in conf.QUEUES if name != DEFAULT_QUEUE]
    return (DEFAULT_QUEUE, *names)


def stored(name: str, argument: str = "queue") -> str | None:
    """What an insert of a job of queue ``name`` writes to its column: None
    for the default queue (the insert leaves the column to its database
    default, ''); ValueError naming the setting when ``name`` is not
    declared (TypeError when it is no str), so a typo never strands a job on
    a queue no server serves."""
    if name == DEFAULT_QUEUE:
        return None
    if name not in conf.QUEUES:
        check_queue_name(name, argument)
        raise ValueError(
            f"{argument}={name!r} is not declared in LATER['QUEUES'] (declared: "
            f"{', '.join(declared())}); add {name!r}: {{}} to it"
        )
    return name


# -- pause and resume ---------------------------------------------------------------
def pause_queue(name: str) -> bool:
    """Pause queue ``name`` on every server; return whether it was running.

    Persisted: it stays paused across restarts until ``resume_queue``. Once
    this returns, no server starts a job of the queue (every claim reads the
    flag); jobs already running finish. ValueError when the queue is not
    declared in LATER["QUEUES"]."""
    return _set_paused(name, paused=True)


def resume_queue(name: str) -> bool:
    """Let queue ``name`` run again; return whether it was paused. Idle
    workers serving it are woken at once."""
    return _set_paused(name, paused=False)


def _set_paused(name: str, *, paused: bool) -> bool:
    from later_django import schema
    from later_django.db import dialect_for

    stored(name, "name")  # refuses an undeclared queue, naming the setting
    alias = conf.database
    dialect = dialect_for(alias)
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            changed = dialect.cluster.queue_set_paused(
                cursor, namespace=conf.namespace, name=name, paused=paused
            )
            if changed and not paused:
                dialect.announce_ready(cursor, namespace=conf.namespace, queue=name)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    return changed


def paused_queues() -> set[str]:
    """The queues of this namespace paused now."""
    from later_django.db import dialect_for

    alias = conf.database
    with connections[alias].cursor() as cursor:
        return dialect_for(alias).cluster.queue_paused(cursor, namespace=conf.namespace)


apause_queue = sync_to_async(pause_queue)
aresume_queue = sync_to_async(resume_queue)


def served(spec: str | None, workers: int) -> dict[str, int]:
    """The queues a server serves and their workers, from ``--queues``
    ("emails=4,default" : a queue without a count gets ``workers``); every
    declared queue with ``workers`` each when ``spec`` is None. ValueError
    naming the problem otherwise."""
    if spec is None:
        return dict.fromkeys(declared(), workers)
    result: dict[str, int] = {}
    for item in spec.split(","):
        name, _, count = item.strip().partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"--queues {spec!r} has an empty item; write e.g. emails=4,default=8")
        stored(name, "--queues")
        if name in result:
            raise ValueError(f"--queues names {name!r} twice")
        if not count:
            result[name] = workers
            continue
        if not count.strip().isdigit() or int(count) < 1:
            raise ValueError(
                f"--queues {name}={count!r}: a queue's workers must be a whole number >= 1"
            )
        result[name] = int(count)
    return result
