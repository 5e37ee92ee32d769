"""Checks of what LATER names: topics, queues (and the queues handlers
name), and the retained-log groups whose lag is measured.
"""

from __future__ import annotations

from django.core.checks import CheckMessage

from later_django import registry
from later_django.checks.messages import error
from later_django.limits import queue_option_errors
from later_django.queue_names import DEFAULT_QUEUE, is_queue_name
from later_django.registry import TOPIC_NAME


def check_topics(topics: object) -> list[CheckMessage]:
    if not isinstance(topics, dict):
        return [
            error(
                "E007",
                "LATER['TOPICS'] must be a dict of name -> partition count.",
                "Set LATER['TOPICS'] = {'orders': 8}.",
            )
        ]
    messages: list[CheckMessage] = []
    for name, count in topics.items():
        if not isinstance(name, str) or not TOPIC_NAME.match(name):
            messages.append(
                error(
                    "E008",
                    f"LATER['TOPICS'] has the invalid topic name {name!r}.",
                    "Use 1-100 characters of letters, digits, '_', '-' or '.'.",
                )
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            messages.append(
                error(
                    "E009",
                    f"LATER['TOPICS'][{name!r}] is {count!r}; a topic needs at least "
                    "one partition.",
                    "Give the topic a partition count >= 1, e.g. 8.",
                )
            )
    return messages


def check_queues(value: object) -> list[CheckMessage]:
    if not isinstance(value, dict):
        return [
            error(
                "E025",
                f"LATER['QUEUES'] is {value!r}; it must be a dict of queue name -> options.",
                "Set LATER['QUEUES'] = {'default': {}, 'emails': {}}.",
            )
        ]
    messages: list[CheckMessage] = []
    for name, options in value.items():
        if not is_queue_name(name) or not isinstance(options, dict):
            messages.append(
                error(
                    "E025",
                    f"LATER['QUEUES'] has {name!r}: {options!r}; a queue is named by an "
                    "identifier of at most 64 characters and its options are a dict.",
                    "Write e.g. LATER['QUEUES'] = {'default': {}, 'emails': {}}.",
                )
            )
            continue
        messages += [
            error(
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
                error(
                    "E026",
                    f"@job(queue={handler.queue!r}) of {handler.name} names a queue "
                    "LATER['QUEUES'] does not declare: its jobs could not be enqueued.",
                    f"Add {handler.queue!r}: {{}} to LATER['QUEUES'], or fix the name.",
                )
            )
    return messages


def check_retained_log_lag(value: object) -> list[CheckMessage]:
    hint = (
        "Set LATER['RETAINED_LOG_LAG'] to a dict of retained-log topic -> list of "
        "consumer groups, or None for every group: {'events': ['billing'], 'audit': None}."
    )
    if not isinstance(value, dict):
        return [
            error("E024", f"LATER['RETAINED_LOG_LAG'] is {value!r:.80}; it must be a dict.", hint)
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
    return [error("E024", f"LATER['RETAINED_LOG_LAG'] is invalid: {'; '.join(problems)}.", hint)]
