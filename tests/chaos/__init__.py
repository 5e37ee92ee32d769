"""A chaos runner for later_django: ``python -m tests.chaos --db postgres|sqlite``.

It runs a workload against a real database with several ``later_worker``
processes, injects faults on a seeded schedule and prints a report of lost
jobs, duplicate handler runs and recovery times. See docs/project/chaos.md.
"""

from __future__ import annotations
