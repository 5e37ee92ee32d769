"""``manage.py later_health``: one line and an exit status (0 healthy, 1 not)
for probes and deploy scripts."""

from __future__ import annotations

import sys
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand

from later_django.health import HealthRequest, check_health


def pid(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a process id") from None
    if number < 1:
        raise ArgumentTypeError(f"a process id is at least 1, got {number}")
    return number


class Command(BaseCommand):
    help = (
        "Check later on LATER['DATABASE'] for a probe or a deploy script: the database "
        "reachable, later's migrations current, this host's servers heartbeating; print "
        "one line with the versions live in the fleet; exit 0 when healthy, 1 when not."
    )
    # A probe answers about later alone, fast: the system checks are
    # `manage.py check`'s business.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--worker",
            action="store_true",
            help="this host must run a later_worker whose heartbeat is fresh (without it, "
            "a host with no server is healthy)",
        )
        parser.add_argument(
            "--pid",
            type=pid,
            default=None,
            help="only the later_worker server of this process id on this host counts "
            "(implies --worker)",
        )
        parser.add_argument(
            "--deep",
            action="store_true",
            help="also check that the stage counters equal the rows and that every "
            "running job has a live lease (read-only)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = check_health(
            HealthRequest(worker=options["worker"], pid=options["pid"], deep=options["deep"])
        )
        self.stdout.write(report.line())
        if not report.healthy:
            sys.exit(1)
