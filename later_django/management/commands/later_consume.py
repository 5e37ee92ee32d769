"""``manage.py later_consume``: run a retained-log consumer group member until
SIGTERM/SIGINT (or, with --until-idle, until it has caught up)."""

from __future__ import annotations

import os
import signal
import socket
import threading
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import import_string

from later_django import retained_log


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number") from None
    if number < 1:
        raise ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def partition_list(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise ArgumentTypeError(f"--partitions takes numbers like 0,1,2; got {value!r}") from None


class Command(BaseCommand):
    help = (
        "Consume a retained-log topic as a member of a consumer group: run a handler "
        "on every record the group has not committed."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("topic", help="the retained-log topic")
        parser.add_argument("--group", required=True, help="the consumer group")
        parser.add_argument(
            "--handler",
            required=True,
            help="dotted path of a function handler(record), e.g. shop.consumers.bill",
        )
        parser.add_argument(
            "--member",
            default=None,
            help="this member's name, unique among live members (default host-pid)",
        )
        parser.add_argument(
            "--partitions", type=partition_list, default=None, help="only these, e.g. 0,1"
        )
        parser.add_argument("--batch-size", type=positive, default=100)
        parser.add_argument(
            "--until-idle", action="store_true", help="stop once every record is handled"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            handler = import_string(options["handler"])
        except ImportError as exc:
            raise CommandError(
                f"--handler {options['handler']!r} does not import: {exc}; give the "
                "dotted path of a function, e.g. shop.consumers.bill"
            ) from exc
        if not callable(handler):
            raise CommandError(f"--handler {options['handler']!r} is not callable")
        member = options["member"] or f"{socket.gethostname()[:40]}-{os.getpid()}"
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            result = retained_log.consume(
                options["topic"],
                group=options["group"],
                member=member,
                handler=handler,
                partitions=options["partitions"],
                batch_size=options["batch_size"],
                until_idle=options["until_idle"],
                stop=stop,
            )
        except (ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] >= 1:
            self.stdout.write(
                f"{member}: handled {result.records} records of {options['topic']} for "
                f"group {options['group']}; leases lost: {result.leases_lost}"
            )
