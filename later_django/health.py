"""What ``later_health`` checks: the database reachable, migrations current,
this host's servers heartbeating, the versions live; and, when asked, the
deep checks (counters against the rows, running jobs' leases). Reads only,
and prints nothing: the command does (docs/how-to/operations.md).
"""

from __future__ import annotations

import re
import socket
from collections import Counter
from dataclasses import dataclass, field

from django.db import DatabaseError, connections

from later_django import schema
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.rows import ServerBeat, ServerBeats


def this_host() -> str:
    """This host's name as a server's heartbeat records it."""
    return socket.gethostname()[:255]


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthRequest:
    """What to check beyond the database and its migrations."""

    # This host must run a server with a fresh heartbeat (a worker host's
    # probe); without it, a host with no server is healthy.
    worker: bool = False
    # Only the server of this process id on this host counts (implies worker).
    pid: int | None = None
    # Also compare the counters with the rows and check the running jobs'
    # leases (cheap, read-only; docs/how-to/operations.md says what they read).
    deep: bool = False
    hostname: str = field(default_factory=this_host)


@dataclass(frozen=True, slots=True)
class HealthReport:
    """The problems found (none: healthy) and what was found fine."""

    problems: tuple[str, ...]
    facts: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return not self.problems

    def line(self) -> str:
        """The answer in one line: the problems first, then the rest."""
        if self.problems:
            return "UNHEALTHY: " + "; ".join((*self.problems, *self.facts))
        return "OK: " + "; ".join(self.facts)


def check_health(request: HealthRequest) -> HealthReport:
    """Run the checks ``request`` asks for on LATER['DATABASE']; never raise
    for what the database answers."""
    alias = conf.database
    problems: list[str] = []
    facts: list[str] = []
    try:
        _check(request, alias, problems, facts)
    except DatabaseError as exc:
        problems.append(
            f"database error on LATER['DATABASE'] {schema.describe(alias)}: {_first(exc)}"
        )
    return HealthReport(tuple(problems), tuple(facts))


def _check(request: HealthRequest, alias: str, problems: list[str], facts: list[str]) -> None:
    # Each step needs the one before: a later one is not run after a problem.
    try:
        missing = schema.missing_tables(alias)
    except DatabaseError as exc:
        problems.append(f"cannot reach LATER['DATABASE'] {schema.describe(alias)}: {_first(exc)}")
        return
    if missing:
        problems.append(schema.missing_tables_message(alias, missing).removesuffix("."))
        return
    facts.append(f"database {alias!r} reachable")
    unapplied = schema.unapplied_migrations(alias)
    if unapplied:
        problems.append(
            f"later's migrations {', '.join(unapplied)} are not applied on {alias!r}; run "
            "`python manage.py later_migrate`"
        )
        return
    unknown = schema.unknown_migrations(alias)
    facts.append(
        "later's migrations current"
        + (f" (and {', '.join(unknown)} of a later release)" if unknown else "")
    )
    dialect = dialect_for(alias)
    namespace = conf.namespace
    with connections[alias].cursor() as cursor:
        beats = dialect.reads.server_beats(cursor, namespace=namespace)
    live_within_ms = conf.millis("PARTITION_HEARTBEAT_TTL")
    _check_host(request, beats, live_within_ms, problems, facts)
    facts.append(_fleet([s for s in beats.servers if _age(beats, s) <= live_within_ms]))
    if request.deep:
        _check_deep(alias, namespace, problems, facts)


def _check_host(
    request: HealthRequest,
    beats: ServerBeats,
    live_within_ms: int,
    problems: list[str],
    facts: list[str],
) -> None:
    """This host's servers: healthy while one of them heartbeats (a server
    killed without a word leaves its row until a live one prunes it)."""
    who = f"host {request.hostname}" + (f" pid {request.pid}" if request.pid is not None else "")
    mine = [
        s for s in beats.servers if s.hostname == request.hostname and request.pid in (None, s.pid)
    ]
    if not mine:
        if request.worker or request.pid is not None:
            problems.append(f"no later_worker server on {who}")
        else:
            facts.append(f"no server on {who}")
        return
    live = [s for s in mine if _age(beats, s) <= live_within_ms]
    if not live:
        last = min(mine, key=lambda s: _age(beats, s))
        problems.append(
            f"{who}: no live server, last heartbeat {_age(beats, last) / 1000:.0f}s ago "
            f"(server {last.id}, pid {last.pid})"
        )
        return
    stale = len(mine) - len(live)
    facts.append(f"{who}: {_servers(len(live))} live" + (f", {stale} silent" if stale else ""))


def _fleet(live: list[ServerBeat]) -> str:
    """The versions the fleet's live servers run: a rolling upgrade shows two."""
    if not live:
        return "fleet: no live server"
    versions = Counter(s.version for s in live)
    # None: servers of a release before versions were recorded, named last.
    named = sorted(
        ((v, n) for v, n in versions.items() if v is not None),
        key=lambda item: _release_order(item[0]),
        reverse=True,
    )
    labels = named + ([("unrecorded", versions[None])] if None in versions else [])
    if len(labels) == 1:
        return f"fleet: {_servers(len(live))} live, version {labels[0][0]}"
    listed = ", ".join(f"{label} ({n})" for label, n in labels)
    return f"fleet: {_servers(len(live))} live, versions {listed}"


def _check_deep(alias: str, namespace: str, problems: list[str], facts: list[str]) -> None:
    dialect = dialect_for(alias)
    # The rescuer retries a job STUCK_JOB_GRACE after its lease expired; a
    # whole lease later than that, nobody is rescuing it.
    overdue_ms = conf.millis("STUCK_JOB_GRACE") + conf.millis("LEASE_DURATION")
    with connections[alias].cursor() as cursor:
        drift = dialect.reads.counter_drift(cursor, namespace=namespace)
        unleased = dialect.reads.running_unleased(
            cursor, namespace=namespace, overdue_ms=overdue_ms
        )
    if drift:
        problems.append(
            "stage counters differ from the rows: "
            + ", ".join(
                f"{d.stage}{f' lane {d.lane!r}' if d.lane else ''} counted {d.counted}, "
                f"rows {d.found}"
                for d in drift
            )
        )
    else:
        facts.append("counters match the rows")
    if unleased.count:
        examples = ", ".join(
            f"{job.id} (lease of {job.owner} expired {job.expired_for_ms / 1000:.0f}s ago)"
            if job.owner is not None and job.expired_for_ms is not None
            else f"{job.id} (no lease)"
            for job in unleased.examples
        )
        problems.append(
            f"{unleased.count} running job(s) without a live lease, none rescued: {examples}"
        )
    else:
        facts.append("every running job has a live lease")


def _release_order(version: str) -> list[str | int]:
    """``version`` split into text and numbers, so 0.10 sorts after 0.9."""
    # re.split with a group alternates text and digits: the types line up.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", version)]


def _age(beats: ServerBeats, server: ServerBeat) -> int:
    return beats.now_ms - server.heartbeat_ms


def _servers(n: int) -> str:
    return f"{n} server{'' if n == 1 else 's'}"


def _first(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0]
