"""What the unique-job tests run in processes of their own: an enqueuer
(``python -m tests.jobapp.unique_processes <index> <count> <out> <go>``)
that enqueues one unique key over and over, every fourth call inside a
transaction that rolls back.

It uses the test database through the environment LaterDb.worker_env() gives.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ACCOUNT = 7


class Rollback(Exception):
    pass


def enqueue_the_same_key(index: int, count: int, out: Path, go: Path) -> None:
    """Say it is ready (``out`` + ".ready"), wait for the file ``go``, then
    enqueue Refresh(account=ACCOUNT) ``count`` times. Write the id of every
    call that committed, and how many rolled back, to ``out`` as JSON."""
    from django.db import transaction

    import later_django as later
    from later_django.conf import conf
    from tests.jobapp.jobs import Refresh

    Path(f"{out}.ready").touch()
    while not go.exists():  # every enqueuer starts together
        time.sleep(0.01)
    committed: list[str] = []
    rolled_back = 0
    for n in range(count):
        payload = Refresh(account=ACCOUNT, n=index * count + n)
        if n % 4 == 3:
            try:
                with transaction.atomic(using=conf.database):
                    later.enqueue(payload)
                    raise Rollback
            except Rollback:
                rolled_back += 1
        else:
            committed.append(later.enqueue(payload))
    out.write_text(json.dumps({"committed": committed, "rolled_back": rolled_back}))


if __name__ == "__main__":
    import django

    django.setup()
    enqueue_the_same_key(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
