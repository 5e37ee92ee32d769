"""System checks for the LATER settings; every ID is listed in docs/reference/checks.md."""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.utils.module_loading import import_string, module_has_submodule

from later_django import registry
from later_django.conf import DEFAULTS, TIMING_KEYS, conf
from later_django.db import dialect_for
from later_django.limits import queue_option_errors
from later_django.partitions.reserved import RECURRING_TOPIC, registered_topics
from later_django.queue_names import DEFAULT_QUEUE, is_queue_name
from later_django.registry import TOPIC_NAME, is_module_name
from later_django.retry import RetryPolicy

MAX_WORKERS = 255


def _error(id_: str, msg: str, hint: str) -> Error:
    return Error(msg, hint=hint, id=f"later.{id_}")


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "LATER", {})
    if not isinstance(raw, dict):
        return [_error("E001", "LATER must be a dict.", "Set LATER = {...} in settings.")]
    merged = {**DEFAULTS, **raw}
    messages: list[CheckMessage] = []
    # repr() for a key that is not a string (LATER = {1: 2}), so it is named too.
    unknown = sorted(key if isinstance(key, str) else repr(key) for key in set(raw) - set(DEFAULTS))
    if unknown:
        messages.append(
            Warning(
                f"LATER has unknown keys: {', '.join(unknown)}.",
                hint=_unknown_keys_hint(unknown),
                id="later.W001",
            )
        )
    messages += _check_workers(merged)
    messages += _check_database(merged)
    messages += _check_topics(merged["TOPICS"])
    messages += _check_values(merged)
    messages += _check_context(merged["CONTEXT"])
    messages += _check_jobs_module(merged["JOBS_MODULE"], explicit="JOBS_MODULE" in raw)
    messages += _check_retained_log_lag(merged["RETAINED_LOG_LAG"])
    messages += _check_queues(merged["QUEUES"])
    return messages


def _check_queues(value: object) -> list[CheckMessage]:
    if not isinstance(value, dict):
        return [
            _error(
                "E025",
                f"LATER['QUEUES'] is {value!r}; it must be a dict of queue name -> options.",
                "Set LATER['QUEUES'] = {'default': {}, 'emails': {}}.",
            )
        ]
    messages: list[CheckMessage] = []
    for name, options in value.items():
        if not is_queue_name(name) or not isinstance(options, dict):
            messages.append(
                _error(
                    "E025",
                    f"LATER['QUEUES'] has {name!r}: {options!r}; a queue is named by an "
                    "identifier of at most 64 characters and its options are a dict.",
                    "Write e.g. LATER['QUEUES'] = {'default': {}, 'emails': {}}.",
                )
            )
            continue
        messages += [
            _error(
                "E025",
                f"{problem}.",
                "Write e.g. LATER['QUEUES'] = {'default': {}, 'emails': {'rate_limit': "
                "'100/m'}}; see docs/how-to/rate-limits.md.",
            )
            for problem in queue_option_errors(name, options)
        ]
    declared = set(value) | {DEFAULT_QUEUE}
    for handler in registry.handlers():
        if handler.queue is not None and handler.queue not in declared:
            messages.append(
                _error(
                    "E026",
                    f"@job(queue={handler.queue!r}) of {handler.name} names a queue "
                    "LATER['QUEUES'] does not declare: its jobs could not be enqueued.",
                    f"Add {handler.queue!r}: {{}} to LATER['QUEUES'], or fix the name.",
                )
            )
    return messages


def _unknown_keys_hint(unknown: list[str]) -> str:
    """Suggest the known key nearest to each unknown one, if any is close."""
    # Compared in upper case: every known key is, and "workers" is a misspelling too.
    guesses = {
        key: close[0]
        for key in unknown
        if (close := difflib.get_close_matches(key.upper(), DEFAULTS, n=1))
    }
    if len(unknown) == 1:
        if guesses:
            return (
                f"Did you mean {guesses[unknown[0]]}? Otherwise remove it; "
                "see docs/reference/settings.md."
            )
        return "Remove it or fix its spelling; see docs/reference/settings.md."
    if not guesses:
        return "Remove them or fix their spelling; see docs/reference/settings.md."
    named = ", ".join(f"{guess} (for {key})" for key, guess in guesses.items())
    return (
        f"Did you mean {named}? Otherwise remove them or fix their spelling; "
        "see docs/reference/settings.md."
    )


def _check_workers(merged: dict[str, Any]) -> list[CheckMessage]:
    workers = merged["WORKERS"]
    messages: list[CheckMessage] = []
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        messages.append(
            _error(
                "E002",
                f"LATER['WORKERS'] is {workers!r}; it must be an int from 1 to {MAX_WORKERS}.",
                "Set LATER['WORKERS'] to the number of jobs one process runs at once, e.g. 6.",
            )
        )
    autoscale = merged["AUTOSCALE"]
    if autoscale is not None:
        ok = (
            isinstance(autoscale, (tuple, list))
            and len(autoscale) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in autoscale)
        )
        if not ok or not 1 <= autoscale[0] <= autoscale[1] <= MAX_WORKERS:
            messages.append(
                _error(
                    "E003",
                    f"LATER['AUTOSCALE'] is {autoscale!r}; it must be (min, max) with "
                    f"1 <= min <= max <= {MAX_WORKERS}.",
                    "Set LATER['AUTOSCALE'] = (2, 16), or None to keep WORKERS fixed.",
                )
            )
    return messages


def _check_database(merged: dict[str, Any]) -> list[CheckMessage]:
    messages = _check_namespace(merged["NAMESPACE"])
    alias = merged["DATABASE"]
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            *messages,
            _error(
                "E004",
                f"LATER['DATABASE'] is {alias!r}, which is not in DATABASES.",
                f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
            ),
        ]
    # The backend's vendor, not its module name: PostGIS is PostgreSQL too.
    try:
        vendor = connections[alias].vendor
    except Exception:  # noqa: BLE001  an ENGINE that does not even import
        vendor = "unknown"
    if vendor not in ("sqlite", "postgresql"):
        engine = settings.DATABASES[alias].get("ENGINE", "")
        messages.append(
            _error(
                "E005",
                f"LATER['DATABASE'] {alias!r} uses {engine}; later supports only "
                "PostgreSQL and SQLite.",
                "Point LATER['DATABASE'] at a PostgreSQL or SQLite database.",
            )
        )
    if vendor == "sqlite":
        options = cast("dict[str, Any]", settings.DATABASES[alias].get("OPTIONS") or {})
        if options.get("transaction_mode") != "IMMEDIATE":
            messages.append(
                Warning(
                    f"SQLite database {alias!r} starts transactions in DEFERRED mode; a "
                    "transaction that reads before it writes can fail with 'database is "
                    "locked' when a worker writes concurrently.",
                    hint=f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE'.",
                    id="later.W002",
                )
            )
    elif merged["VACUUM_INTERVAL"] is not None:
        messages.append(
            Warning(
                "LATER['VACUUM_INTERVAL'] applies to SQLite only and is ignored here.",
                hint="Remove it; PostgreSQL's autovacuum does this work.",
                id="later.W003",
            )
        )
    return messages


def _check_namespace(namespace: object) -> list[CheckMessage]:
    if not isinstance(namespace, str) or not 1 <= len(namespace) <= 64:
        return [
            _error(
                "E006",
                f"LATER['NAMESPACE'] is {namespace!r}; it must be a string of 1 to 64 characters.",
                "Set LATER['NAMESPACE'] = 'default' or another short name.",
            )
        ]
    return []


def _check_topics(topics: object) -> list[CheckMessage]:
    if not isinstance(topics, dict):
        return [
            _error(
                "E007",
                "LATER['TOPICS'] must be a dict of name -> partition count.",
                "Set LATER['TOPICS'] = {'orders': 8}.",
            )
        ]
    messages: list[CheckMessage] = []
    for name, count in topics.items():
        if not isinstance(name, str) or not TOPIC_NAME.match(name):
            messages.append(
                _error(
                    "E008",
                    f"LATER['TOPICS'] has the invalid topic name {name!r}.",
                    "Use 1-100 characters of letters, digits, '_', '-' or '.'.",
                )
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            messages.append(
                _error(
                    "E009",
                    f"LATER['TOPICS'][{name!r}] is {count!r}; a topic needs at least "
                    "one partition.",
                    "Give the topic a partition count >= 1, e.g. 8.",
                )
            )
    return messages


def _check_values(merged: dict[str, Any]) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for key in sorted(TIMING_KEYS):
        value = merged[key]
        if key == "VACUUM_INTERVAL" and value is None:
            continue
        if not isinstance(value, timedelta) or value <= timedelta(0):
            messages.append(
                _error(
                    "E010",
                    f"LATER[{key!r}] is {value!r}; it must be a positive timedelta.",
                    f"Set LATER[{key!r}] = timedelta(seconds=...).",
                )
            )
    count = merged["DEFAULT_RETRY_COUNT"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        messages.append(
            _error(
                "E011",
                f"LATER['DEFAULT_RETRY_COUNT'] is {count!r}; it must be an int >= 0.",
                "Set it to the number of retries after the first attempt, e.g. 6.",
            )
        )
    policy = merged["DEFAULT_RETRY_POLICY"]
    if policy is not None and not isinstance(policy, RetryPolicy):
        kind = type(policy).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        messages.append(
            _error(
                "E012",
                f"LATER['DEFAULT_RETRY_POLICY'] is {article} {kind}; it must "
                "be a RetryPolicy or None.",
                "Use RetryPolicy.fixed(3, timedelta(seconds=5)).",
            )
        )
    limit = merged["MAX_PAYLOAD_BYTES"]
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        messages.append(
            _error(
                "E013",
                f"LATER['MAX_PAYLOAD_BYTES'] is {limit!r}; it must be an int >= 1.",
                "Leave the default (1 MiB) or set a positive byte count.",
            )
        )
    prepared = merged["PREPARED_STATEMENTS"]
    if not isinstance(prepared, bool):
        messages.append(
            _error(
                "E016",
                f"LATER['PREPARED_STATEMENTS'] is {prepared!r}; it must be True or False.",
                "Leave it True, or set False behind a pooler that cannot keep "
                "prepared statements (PgBouncer in transaction mode before 1.21).",
            )
        )
    messages += _check_tracing(merged["TRACING"])
    run_inline = merged["RUN_INLINE"]
    if not isinstance(run_inline, bool):
        messages.append(
            _error(
                "E023",
                f"LATER['RUN_INLINE'] is {run_inline!r}; it must be True or False.",
                "Set LATER['RUN_INLINE'] = True in test settings to run jobs when their "
                "enqueue commits, or leave the key out.",
            )
        )
    partitions = merged["RECURRING_SEQUENTIAL_PARTITIONS"]
    if partitions is not None and (
        not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1
    ):
        messages.append(
            _error(
                "E014",
                f"LATER['RECURRING_SEQUENTIAL_PARTITIONS'] is {partitions!r}; it must "
                "be None or an int >= 1.",
                "Set it to a partition count such as 4.",
            )
        )
    return messages


def _check_tracing(tracing: object) -> list[CheckMessage]:
    if not isinstance(tracing, bool):
        return [
            _error(
                "E020",
                f"LATER['TRACING'] is {tracing!r}; it must be True or False.",
                "Set True to trace each job's run with OpenTelemetry, else leave it out.",
            )
        ]
    if tracing and importlib.util.find_spec("opentelemetry") is None:
        return [
            _error(
                "E021",
                "LATER['TRACING'] is True but opentelemetry-api is not installed.",
                'pip install "later-django[tracing]" (and an OpenTelemetry SDK and '
                "exporter), or set LATER['TRACING'] = False.",
            )
        ]
    return []


def _check_context(path: object) -> list[CheckMessage]:
    hint = (
        "Set LATER['CONTEXT'] to the dotted path of a function that takes no "
        "arguments, e.g. 'shop.context.build', or None."
    )
    if path is None:
        return []
    if not isinstance(path, str):
        if callable(path):
            return []
        return [_error("E018", f"LATER['CONTEXT'] is {path!r}; it must be a dotted path.", hint)]
    try:
        factory = import_string(path)
    except Exception as exc:  # noqa: BLE001  any error of the user's module is reported
        return [
            _error(
                "E017",
                f"LATER['CONTEXT'] is {path!r}, which does not import: "
                f"{type(exc).__name__}: {exc}.",
                hint,
            )
        ]
    if not callable(factory):
        return [
            _error(
                "E018",
                f"LATER['CONTEXT'] is {path!r}, which is a {type(factory).__name__}, "
                "not a callable.",
                hint,
            )
        ]
    return []


def _check_jobs_module(name: object, *, explicit: bool) -> list[CheckMessage]:
    if not is_module_name(name):
        return [
            _error(
                "E019",
                f"LATER['JOBS_MODULE'] is {name!r}; it must be a module name such as 'jobs'.",
                "Set it to the name of the module later imports from every installed "
                "app: 'jobs' for shop/jobs.py.",
            )
        ]
    # An app without the module is fine (like admin.py), but a name that no
    # app has, set on purpose, is a mistake: no handler is registered by it.
    # Importing a module that exists already happened in AppConfig.ready(),
    # and an error there stopped Django's start-up with its traceback.
    if not explicit or any(
        module_has_submodule(app.module, name) for app in apps.get_app_configs()
    ):
        return []
    return [
        Warning(
            f"LATER['JOBS_MODULE'] is {name!r}, but no installed app has a module of "
            "that name, so no handler is registered from it.",
            hint="Give the module's name inside each app ('jobs' for shop/jobs.py), "
            "not a file name or a dotted path from the project; or remove the key "
            "to use 'jobs'.",
            id="later.W004",
        )
    ]


def _check_retained_log_lag(value: object) -> list[CheckMessage]:
    hint = (
        "Set LATER['RETAINED_LOG_LAG'] to a dict of retained-log topic -> list of "
        "consumer groups, or None for every group: {'events': ['billing'], 'audit': None}."
    )
    if not isinstance(value, dict):
        return [
            _error("E024", f"LATER['RETAINED_LOG_LAG'] is {value!r:.80}; it must be a dict.", hint)
        ]
    problems = []
    for topic, groups in value.items():
        if not isinstance(topic, str) or not TOPIC_NAME.match(topic):
            problems.append(f"{topic!r} is not a valid topic name")
        elif groups is not None and (
            not isinstance(groups, list | tuple)
            or not all(isinstance(g, str) and 1 <= len(g) <= 100 for g in groups)
        ):
            problems.append(f"the groups of {topic!r} must be None or a list of names")
    if not problems:
        return []
    return [_error("E024", f"LATER['RETAINED_LOG_LAG'] is invalid: {'; '.join(problems)}.", hint)]


@register(Tags.database)
def check_stored_topics(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Compare LATER['TOPICS'] (and RECURRING_SEQUENTIAL_PARTITIONS) with the
    partition counts stored by earlier runs."""
    alias = conf.database
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    return [
        topic_conflict(name, count, stored)
        for name, count, stored in stored_topic_conflicts(alias, registered_topics())
    ]


def topic_conflict(name: str, count: int, stored: int) -> CheckMessage:
    if name == RECURRING_TOPIC:
        return _error(
            "E015",
            f"LATER['RECURRING_SEQUENTIAL_PARTITIONS'] is {count} but sequential recurring "
            f"jobs were registered with {stored} partitions; changing it would move "
            "schedules to other partitions and let their occurrences overlap.",
            f"Restore LATER['RECURRING_SEQUENTIAL_PARTITIONS'] = {stored}.",
        )
    return _error(
        "E015",
        f"Topic {name!r} has {count} partitions in LATER['TOPICS'] but was "
        f"registered with {stored}; changing it would reorder its jobs.",
        f"Restore LATER['TOPICS'][{name!r}] = {stored}, or use a new topic name.",
    )


def stored_topic_conflicts(alias: str, topics: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, configured, stored) for every topic whose count changed."""
    try:
        with connections[alias].cursor() as cursor:
            stored = dialect_for(alias).partitions.topic_partitions(
                cursor, namespace=conf.namespace
            )
    except DatabaseError:
        return []  # not migrated yet: later_migrate registers the topics
    return [
        (name, count, stored[name])
        for name, count in topics.items()
        if name in stored and stored[name] != count
    ]
