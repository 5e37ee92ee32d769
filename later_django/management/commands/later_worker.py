"""``manage.py later_worker``: run one supervised worker process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import sys
import threading
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from later_django import queues, schema
from later_django.conf import conf
from later_django.worker.extensions import ExtensionFactory
from later_django.worker.processes import Parent, child_env, die_with_parent, process_count
from later_django.worker.server import Server
from later_django.worker.workers import MAX_WORKERS

logger = logging.getLogger("later_django.worker")


def worker_count(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number of workers") from None
    if not 1 <= count <= MAX_WORKERS:
        raise ArgumentTypeError(f"workers must be between 1 and {MAX_WORKERS}, got {count}")
    return count


def autoscale_bounds(value: str) -> tuple[int, int]:
    low, sep, high = value.partition(":")
    if not sep:
        raise ArgumentTypeError(f"--autoscale takes MIN:MAX, e.g. 2:16; got {value!r}")
    bounds = (worker_count(low), worker_count(high))
    if bounds[0] > bounds[1]:
        raise ArgumentTypeError(f"--autoscale MIN must not exceed MAX, got {value!r}")
    return bounds


def seconds(value: str) -> float:
    try:
        result = float(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if result < 0:
        raise ArgumentTypeError("--shutdown-timeout must be >= 0")
    return result


def processes(value: str) -> int:
    try:
        return process_count(value)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


def port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= number <= 65535:
        raise ArgumentTypeError(f"a port is 1..65535, got {number}")
    return number


class Command(BaseCommand):
    help = "Run a later worker process: a supervised pool of workers on LATER['DATABASE']."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--workers",
            type=worker_count,
            default=None,
            help="worker tasks in this process (default LATER['WORKERS'])",
        )
        parser.add_argument(
            "--queues",
            default=None,
            metavar="NAME[=WORKERS],...",
            help="the queues this process serves and their workers, e.g. emails=4,default=8 "
            "(a queue without a count gets --workers; default: every queue of "
            "LATER['QUEUES'], --workers each)",
        )
        parser.add_argument(
            "--processes",
            type=processes,
            default=1,
            metavar="N|auto",
            help="run N worker processes under this one (auto: one per core), each with "
            "these options; for sync handlers that use the CPU (default 1)",
        )
        parser.add_argument(
            "--autoscale",
            type=autoscale_bounds,
            default=None,
            metavar="MIN:MAX",
            help="scale workers with the backlog",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=seconds,
            default=None,
            help="seconds running jobs get to finish on SIGTERM",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            default=None,
            help="serve Prometheus metrics over HTTP on this port (path /metrics), on "
            "every IPv4 interface unless --metrics-addr says otherwise",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",
            help="the address --metrics-port listens on (default %(default)s: every IPv4 "
            "interface; 127.0.0.1 for this host only, :: for IPv6)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if conf.RUN_INLINE:
            # Jobs enqueued by this worker's handlers would run inline, in
            # the handler's thread, beside the worker's own claims.
            raise CommandError(
                "LATER['RUN_INLINE'] is True: jobs run in the process that enqueues "
                "them, with no worker. Turn it off to run later_worker."
            )
        die_with_parent()
        _check_tables(conf.database)
        # Checks that read the database (e.g. a topic's changed partition
        # count, later.E015) must stop a worker before it claims anything.
        self.check(databases=[conf.database], tags=[Tags.database])
        _configure_logging(int(options["verbosity"]))
        workers = options["workers"] if options["workers"] is not None else conf.WORKERS
        try:
            served = queues.served(options["queues"], int(workers))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["processes"] > 1:
            connections.close_all()  # the children connect for themselves
            timeout = options["shutdown_timeout"]
            if timeout is None:
                timeout = conf.seconds("SHUTDOWN_TIMEOUT")
            code = Parent(_child_argvs(options), child_env(), shutdown_timeout=timeout).run()
            if code:
                sys.exit(code)
            return
        endpoint = None
        feeds: list[ExtensionFactory] = []
        if options["metrics_port"] is not None:
            feed, endpoint = _serve_metrics(options["metrics_addr"], options["metrics_port"])
            feeds.append(feed)
        server = Server(
            queues=served,
            workers=options["workers"],
            autoscale=options["autoscale"],
            shutdown_timeout=options["shutdown_timeout"],
            extensions=feeds,
        )
        # Serving never uses the main thread's connection (the loop and the
        # pools have their own): the one the start-up checks opened would
        # sit idle for the process's life, counted against max_connections.
        connections.close_all()
        try:
            code = asyncio.run(_serve(server))
        finally:
            if endpoint is not None:
                endpoint.shutdown()
        # A sync handler stuck past the deadline keeps its thread alive, and
        # Python would wait for it at exit; its lease recovers the job instead.
        if any(t.name.startswith("later-handler") for t in threading.enumerate()):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            sys.exit(code)


def _child_argvs(options: dict[str, Any]) -> list[list[str]]:
    """The command line of each child of --processes: this command with
    this one's options, and --metrics-port plus the child's index."""
    common = [sys.executable, "-m", "django", "later_worker", "-v", str(options["verbosity"])]
    for name in ("workers", "queues", "shutdown_timeout"):
        if options[name] is not None:
            common += [f"--{name.replace('_', '-')}", str(options[name])]
    if options["autoscale"] is not None:
        common += ["--autoscale", "{}:{}".format(*options["autoscale"])]
    argvs = []
    for index in range(options["processes"]):
        argv = list(common)
        if options["metrics_port"] is not None:
            port = options["metrics_port"] + index
            argv += ["--metrics-port", str(port), "--metrics-addr", options["metrics_addr"]]
        argvs.append(argv)
    return argvs


def _serve_metrics(addr: str, port: int) -> tuple[ExtensionFactory, Any]:
    """Install later's metrics and serve them on ``addr:port`` from a thread;
    return the server's feed of them and the HTTP server. Imported only here:
    a worker without --metrics-port never loads prometheus_client."""
    import prometheus_client

    from later_django import metrics
    from later_django.metrics_feed import MetricsFeed

    installed = metrics.install()
    try:
        httpd, _ = prometheus_client.start_http_server(port, addr)
    except OSError as exc:
        raise CommandError(
            f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}; pick another "
            "--metrics-port (or --metrics-addr)"
        ) from exc
    logger.info(
        "serving Prometheus metrics on http://%s:%d/metrics",
        addr,
        port,
        extra={"action": "metrics_serving"},
    )
    return functools.partial(MetricsFeed, installed), httpd


def _check_tables(alias: str) -> None:
    """Stop with one line, before anything connects, when later's tables
    are missing, its migrations are behind this release's, or the database
    cannot be reached."""
    try:
        missing = schema.missing_tables(alias)
    except DatabaseError as exc:
        first_line = str(exc).strip().split("\n", 1)[0]
        raise CommandError(
            f"cannot reach LATER['DATABASE'] {schema.describe(alias)}: {first_line}"
        ) from exc
    if missing:
        raise CommandError(schema.missing_tables_message(alias, missing))
    unapplied = schema.unapplied_migrations(alias)
    if unapplied:
        raise CommandError(schema.unapplied_migrations_message(alias, unapplied))


async def _serve(server: Server) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = {"count": 0}

    def on_signal(signum: int) -> None:
        signals["count"] += 1
        if signals["count"] == 1:
            logger.info(
                "received %s: running jobs get up to %gs to finish (--shutdown-timeout), "
                "then this process stops; a second signal stops them now and gives their "
                "jobs back, a third exits at once",
                signal.Signals(signum).name,
                server.shutdown_timeout,
                extra={"action": "shutdown_requested"},
            )
            stop.set()
        elif signals["count"] == 2:
            logger.warning(
                "second signal: stopping running jobs now; async ones are given back to "
                "run again, sync ones are recovered by their leases",
                extra={"action": "shutdown_hurried"},
            )
            server.hurry()
        else:
            logger.warning("third signal: exiting now; leases recover running jobs")
            os._exit(1)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await server.start()
    # Everything made until now (Django, the apps, the server) lives as long
    # as the process: out of the collector's sight, a full collection walks
    # only what jobs made since, instead of stalling the loop for tens of ms.
    gc.freeze()
    await stop.wait()
    await server.shutdown()
    return 0


def _configure_logging(verbosity: int) -> None:
    root = logging.getLogger("later_django")
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    root.propagate = False
