"""The topic of the workload's partitioned jobs (app/jobs.py ``Ordered``).

A module of its own: the settings register it in LATER["TOPICS"] and the
job types name it, and importing the settings module from the jobs would
read the environment before the runner has set it.
"""

from __future__ import annotations

ORDERED_TOPIC = "chaos-ordered"
ORDERED_PARTITIONS = 8
