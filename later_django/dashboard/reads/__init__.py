"""What the dashboard shows, read for its pages and its JSON alike: one
module per kind of page (the overview, the job pages, the pages of named
things). Everything here reads counters, small tables or one index range:
nothing grows with the backlog (docs/how-to/dashboard.md has the plans)."""

from __future__ import annotations

from later_django.dashboard.reads.jobs import (
    counts,
    durations,
    job_detail,
    job_page,
    page_dict,
    parse_history,
    summary_dict,
)
from later_django.dashboard.reads.overview import SAMPLE_POINTS, SAMPLE_RANGES, overview, samples
from later_django.dashboard.reads.panels import previous_release_servers, queues, recurring, topics

__all__ = [
    "SAMPLE_POINTS",
    "SAMPLE_RANGES",
    "counts",
    "durations",
    "job_detail",
    "job_page",
    "overview",
    "page_dict",
    "parse_history",
    "previous_release_servers",
    "queues",
    "recurring",
    "samples",
    "summary_dict",
    "topics",
]
