from __future__ import annotations

from django.db import transaction

import later_django as later
from tests.jobapp.jobs import Noop


def test_enqueue_smoke(later_db):
    job_id = later.enqueue(Noop(n=1))
    assert later_db.stage_of(job_id) == "enqueued"
    with transaction.atomic(using=later_db.alias):
        later.enqueue_in(Noop(n=2))
    assert later.stage_counts()["enqueued"] == 2
    info = later.get_job(job_id)
    assert info is not None and info.stage == "enqueued"
