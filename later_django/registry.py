"""The handler registry: the ``@job`` decorator and lookup by payload type or name."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar, overload

from later_django.exceptions import AlreadyRegistered, NotRegistered
from later_django.limits import KeyFunction, check_concurrency
from later_django.options import check_priority, check_unique_key, timeout_ms
from later_django.queue_names import DEFAULT_QUEUE, check_queue_name
from later_django.retry import RetryPolicy

F = TypeVar("F", bound=Callable[..., Any])
RetrySpec = RetryPolicy | Callable[..., RetryPolicy] | None
# A type's unique key: one for all its jobs, or made from each payload.
UniqueKeySpec = str | Callable[[Any], str] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Handler:
    """A registered handler: the function, its payload type and options."""

    name: str
    payload_type: type[Any]
    func: Callable[..., Any]
    is_async: bool
    retry: RetrySpec = None
    # Sequential partition mode: the topic its jobs go to (docs/how-to/partitions.md).
    topic: str | None = None
    # The priority of its jobs when an enqueue gives none.
    priority: int = 0
    # How long one attempt may run, in ms, when an enqueue gives no timeout.
    timeout_ms: int | None = None
    # The queue of its jobs when an enqueue names none (None: "default").
    queue: str | None = None
    # Its jobs' unique key when an enqueue gives none, and the window of
    # unique_for in ms (docs/how-to/unique-jobs.md).
    unique_key: UniqueKeySpec = None
    unique_for_ms: int | None = None
    # Its writes on the LATER database commit with its job's success, in one
    # transaction, or roll back with a failure (docs/how-to/atomic-jobs.md).
    atomic: bool = False
    # At most ``concurrency`` of its jobs of one ``concurrency_key(payload)``
    # run at once (no key: one limit over the type; docs/how-to/concurrency-limits.md).
    concurrency_key: KeyFunction | None = None
    concurrency: int | None = None

    def static_policy(self) -> RetryPolicy | None:
        """The policy known at enqueue time (None: default or a callable)."""
        return self.retry if isinstance(self.retry, RetryPolicy) else None


_by_type: dict[type[Any], Handler] = {}
_by_name: dict[str, Handler] = {}
# The types with a concurrency limit, a unique key, a named queue: every
# enqueue asks whether there are any, without looking at every handler.
_keyed: dict[type[Any], Handler] = {}
_unique: set[type[Any]] = set()
_queued: set[type[Any]] = set()
# Find handlers of names no @job registered, on first use: the Django Tasks
# backend's jobs are named by their task's import path (later_django.tasks).
_resolvers: list[Callable[[str], Handler | None]] = []


def default_name(payload_type: type[Any]) -> str:
    return f"{payload_type.__module__}.{payload_type.__qualname__}"


@overload
def job(func: F, /) -> F: ...
@overload
def job(
    *,
    name: str | None = ...,
    retry: RetrySpec = ...,
    topic: str | None = ...,
    priority: int = ...,
    timeout: dt.timedelta | None = ...,
    queue: str | None = ...,
    unique_key: UniqueKeySpec = ...,
    unique_for: dt.timedelta | None = ...,
    atomic: bool = ...,
    concurrency_key: KeyFunction | None = ...,
    concurrency: int | None = ...,
) -> Callable[[F], F]: ...


def job(
    func: F | None = None,
    /,
    *,
    name: str | None = None,
    retry: RetrySpec = None,
    topic: str | None = None,
    priority: int = 0,
    timeout: dt.timedelta | None = None,
    queue: str | None = None,
    unique_key: UniqueKeySpec = None,
    unique_for: dt.timedelta | None = None,
    atomic: bool = False,
    concurrency_key: KeyFunction | None = None,
    concurrency: int | None = None,
) -> F | Callable[[F], F]:
    """Register ``func(ctx, payload)`` as the handler of its payload's type.

    The payload type is the annotation of the second parameter, a dataclass.
    The keywords are the defaults of the type's jobs: ``retry`` (a
    RetryPolicy, or a callable ``(ctx, payload) -> RetryPolicy``),
    ``priority``, ``timeout``, ``queue``, ``unique_key``/``unique_for``,
    ``atomic`` (sync handlers only), ``concurrency_key``/``concurrency``;
    ``topic`` puts them in sequential partition mode. Each one:
    docs/how-to/jobs.md. Bad options raise at import time.
    """

    def register(func: F) -> F:
        payload_type = _payload_type_of(func)
        if retry is not None and not (isinstance(retry, RetryPolicy) or callable(retry)):
            raise TypeError(
                f"@job(retry=...) of {func.__qualname__} must be a RetryPolicy or a "
                f"callable returning one, got {type(retry).__name__}"
            )
        if topic is not None:
            _check_topic(func, payload_type, topic)
        _check_atomic(func, atomic)
        try:
            check_priority(priority)
            attempt_ms = None if timeout is None else timeout_ms(timeout, "timeout")
            if queue is not None:
                check_queue_name(queue)
                if topic is not None:
                    raise TypeError(
                        f"queue={queue!r} and topic={topic!r} both say where the jobs run: "
                        "a topic's jobs run in partition order on partition workers, not "
                        "on a queue; pass one of them"
                    )
            window = _check_unique(unique_key, unique_for, topic)
            limit = check_concurrency(concurrency_key, concurrency)
            if limit is not None and topic is not None:
                raise TypeError(
                    f"concurrency limits do not apply to topic={topic!r}: a partition "
                    "runs one job at a time already; drop concurrency_key/concurrency, "
                    "or the topic"
                )
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"@job(...) of {func.__qualname__}: {exc}") from None
        handler = Handler(
            name=name or default_name(payload_type),
            payload_type=payload_type,
            func=func,
            is_async=inspect.iscoroutinefunction(func),
            retry=retry,
            topic=topic,
            priority=priority,
            timeout_ms=attempt_ms,
            queue=None if queue == DEFAULT_QUEUE else queue,
            unique_key=unique_key,
            unique_for_ms=window,
            atomic=atomic,
            concurrency_key=concurrency_key,
            concurrency=limit,
        )
        _register(handler)
        return func

    if func is not None:
        return register(func)
    return register


def _check_unique(
    unique_key: UniqueKeySpec, unique_for: dt.timedelta | None, topic: str | None
) -> int | None:
    """The window of @job(unique_for=...) in ms, once the unique options are
    checked."""
    if unique_key is None and unique_for is None:
        return None
    if topic is not None:
        raise TypeError(
            "unique_key and unique_for do not apply to a topic's jobs: a partition runs "
            "every job it is given, in order"
        )
    if isinstance(unique_key, str):
        check_unique_key(unique_key, "unique_key")
    elif unique_key is not None and not callable(unique_key):
        raise TypeError(
            f"unique_key must be a str or a callable given the payload, got "
            f"{type(unique_key).__name__}"
        )
    if unique_for is None:
        return None
    if unique_key is None:
        raise TypeError("unique_for needs a unique_key: pass @job(unique_key=...) too")
    return timeout_ms(unique_for, "unique_for")


def any_unique() -> bool:
    """Does any registered type give its jobs a unique key (a bulk enqueue
    then looks at its rows before writing them)?"""
    return bool(_unique)


def _payload_type_of(func: Callable[..., Any]) -> type[Any]:
    params = list(inspect.signature(func).parameters.values())
    if len(params) != 2:
        raise TypeError(
            f"@job handler {func.__qualname__} must take (ctx, payload), "
            f"got {len(params)} parameters"
        )
    hint = typing.get_type_hints(func).get(params[1].name)
    if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        raise TypeError(
            f"@job handler {func.__qualname__}: annotate its payload parameter "
            f"{params[1].name!r} with a @dataclass type"
        )
    return hint


# A topic name as LATER["TOPICS"] takes it (checks.py): the reserved topic
# of sequential recurring jobs has a ':' so that no user topic can take it.
TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def _check_topic(func: Callable[..., Any], payload_type: type[Any], topic: object) -> None:
    if not isinstance(topic, str) or not TOPIC_NAME.match(topic):
        raise TypeError(
            f"@job(topic=...) of {func.__qualname__} must be a topic name of LATER['TOPICS'] "
            f"(1-100 letters, digits, '_', '-' or '.'), got {topic!r}"
        )
    if not callable(getattr(payload_type, "partition_key", None)):
        raise TypeError(
            f"@job(topic={topic!r}) of {func.__qualname__}: its payload type "
            f"{payload_type.__qualname__} needs a partition_key(self) method returning "
            "the str, int or bytes key whose jobs run in order"
        )


def _check_atomic(func: Callable[..., Any], atomic: object) -> None:
    if not isinstance(atomic, bool):
        raise TypeError(
            f"@job(atomic=...) of {func.__qualname__} must be True or False, "
            f"got {type(atomic).__name__}"
        )
    if atomic and inspect.iscoroutinefunction(func):
        # An async handler's queries run on threads of their own (Django's
        # async ORM), outside any transaction the worker could open for it.
        raise TypeError(
            f"@job(atomic=True) of {func.__qualname__}: an async handler cannot be "
            "atomic, its database calls run outside the job's transaction; use a sync "
            "handler (def, not async def)"
        )


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _register(handler: Handler) -> None:
    # Check the type and the name separately: re-registering the same function
    # (a module reload) must not take over a name another type holds.
    for taken in (_by_type.get(handler.payload_type), _by_name.get(handler.name)):
        if taken is not None and not _same_function(taken.func, handler.func):
            raise AlreadyRegistered(
                f"payload type {handler.name} already has the handler "
                f"{taken.func.__module__}.{taken.func.__qualname__}; "
                f"{handler.func.__module__}.{handler.func.__qualname__} cannot also "
                "handle it: one handler per payload type"
            )
    for replaced in (_by_type.get(handler.payload_type), _by_name.get(handler.name)):
        if replaced is not None:
            _by_type.pop(replaced.payload_type, None)
            _by_name.pop(replaced.name, None)
            _keyed.pop(replaced.payload_type, None)
            _unique.discard(replaced.payload_type)
            _queued.discard(replaced.payload_type)
    _by_type[handler.payload_type] = handler
    if handler.concurrency is not None:
        _keyed[handler.payload_type] = handler
    if handler.unique_key is not None:
        _unique.add(handler.payload_type)
    if handler.queue is not None:
        _queued.add(handler.payload_type)
    _by_name[handler.name] = handler


def handler_for_payload(payload: object) -> Handler:
    """Return the handler of ``payload``'s type or raise NotRegistered."""
    handler = _by_type.get(type(payload))
    if handler is None:
        raise NotRegistered(
            f"{default_name(type(payload))} has no @job handler; define one in a "
            "jobs.py module of an installed app (or import the module defining it)"
        )
    return handler


def handler_by_name(name: str) -> Handler | None:
    handler = _by_name.get(name)
    if handler is None and _resolvers:
        handler = _resolve(name)
    return handler


def handlers() -> list[Handler]:
    """Every handler registered with @job."""
    return list(_by_type.values())


def any_queue() -> bool:
    """Does any registered type name a queue (bulk inserts then carry the
    queue column)?"""
    return bool(_queued)


def keyed_queues() -> set[str]:
    """The queues some registered type with a concurrency limit runs on by
    its @job(queue=...): the claims of those keep concurrency limits."""
    return {handler.queue or DEFAULT_QUEUE for handler in _keyed.values()}


def any_keyed() -> bool:
    """Does any registered type have a concurrency limit (a bulk enqueue of
    its jobs then takes one insert per job)?"""
    return bool(_keyed)


def is_keyed(payload_type: type[Any]) -> bool:
    """Does the registered handler of ``payload_type`` have a concurrency limit?"""
    return payload_type in _keyed


def registered_names() -> list[str]:
    """The names of every registered job type, sorted (the dashboard's type filter)."""
    return sorted(_by_name)


def _resolve(name: str) -> Handler | None:
    for resolver in _resolvers:
        handler = resolver(name)
        if handler is not None:
            _by_name[name] = handler  # the next job of this name is a dict hit
            return handler
    return None


def add_resolver(resolver: Callable[[str], Handler | None]) -> None:
    """Let ``resolver(name)`` supply the handler of jobs named ``name`` that no
    @job registered (it returns None for names that are not its own)."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def is_module_name(value: object) -> TypeGuard[str]:
    """Is ``value`` a module name such as ``"jobs"`` or ``"tasks.handlers"``?"""
    return isinstance(value, str) and all(part.isidentifier() for part in value.split("."))


def autodiscover(module_name: str) -> None:
    """Import ``module_name`` from every installed app, as the admin does with admin.py.

    An app without that module is skipped. An error raised while importing
    a module that exists propagates, so a broken jobs module stops Django's
    start-up with its traceback instead of leaving its handlers out.
    """
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules(module_name)


def unregister(payload_type: type[Any]) -> None:
    """Remove the handler of ``payload_type`` (for tests)."""
    handler = _by_type.pop(payload_type, None)
    _keyed.pop(payload_type, None)
    _unique.discard(payload_type)
    _queued.discard(payload_type)
    if handler is not None:
        _by_name.pop(handler.name, None)
