"""The worker's claim and batch completion on a Django cursor, for tests
that need them inside their own transaction: the library's own seam
(later_django/db/hot_path.py), which later_django.testing uses too."""

from __future__ import annotations

from later_django.db.hot_path import job_claim, job_complete_many

__all__ = ["job_claim", "job_complete_many"]
