"""What the retained-log tests run in processes of their own: an appender
(``python -m tests.jobapp.log_processes append ...``) and a consumer handler
for ``manage.py later_consume``.

Both use the test database through the environment LaterDb.worker_env() gives.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from later_django.retained_log import Record

# Records appended one call each, before the rest go in append_many batches.
SINGLE = 500
BATCH = 250


def record_then_hang(record: Record) -> None:
    """Write the record's offset to LATER_TEST_RECORD; on a value of b"hang",
    stop there for good (the test kills the process)."""
    with open(os.environ["LATER_TEST_RECORD"], "a") as fh:
        fh.write(f"{record.partition} {record.offset}\n")
    if record.value == b"hang":
        time.sleep(3600)


def append_records(index: int, count: int, out: Path, go: Path) -> None:
    """Say it is ready (``out`` + ".ready"), wait for the file ``go``, then
    append ``count`` records keyed by this appender's ``index``: the first
    SINGLE one by one, the rest in batches. Write every record's (key,
    partition, offset) to ``out`` as JSON."""
    from later_django import retained_log as log

    Path(f"{out}.ready").touch()
    while not go.exists():  # all appenders start together
        time.sleep(0.01)
    keys = [f"a{index}-{n}" for n in range(count)]
    placed = [log.append("events", key=key, value=key.encode()) for key in keys[:SINGLE]]
    for start in range(SINGLE, count, BATCH):
        chunk = keys[start : start + BATCH]
        placed += log.append_many("events", [(key, key.encode()) for key in chunk])
    out.write_text(json.dumps([[key, *where] for key, where in zip(keys, placed, strict=True)]))


if __name__ == "__main__":
    import django

    django.setup()
    if sys.argv[1] == "append":
        append_records(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
