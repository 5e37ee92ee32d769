"""JobBuilder: turns payloads and their EnqueueOptions into NewJob rows.

Every way of creating jobs builds its rows here, so all refuse the same
payloads with the same errors. It writes nothing and opens no connection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from later_django import codec, limits, queues, registry
from later_django.conf import conf
from later_django.exceptions import PayloadTooLarge
from later_django.ids import new_job_id
from later_django.options import EnqueueOptions, check_unique_key
from later_django.queue_names import name_of
from later_django.types import NewJob

# What every job of one payload type shares, looked up once per builder: its
# handler and the handler's static retry policy as stored JSON. A plain tuple:
# a single enqueue makes one, and a NamedTuple takes many times longer to make.
_TypeFacts = tuple[registry.Handler, str | None]


class JobBuilder:
    """Build job rows, reading settings and per-type facts once per builder.

    One per call or per batch: a batch of thousands pays for the lookups
    once, and a builder kept across calls would miss a settings change or
    a handler registered anew.
    """

    __slots__ = (
        "max_payload_bytes",
        "namespace",
        "partitioned",
        "_keyed_queues",
        "_queues",
        "_types",
    )

    def __init__(self, *, partitioned: bool = False) -> None:
        self.namespace = conf.namespace
        self.max_payload_bytes = int(conf.MAX_PAYLOAD_BYTES)
        # Builds partition jobs (enqueue_to_partition and friends): only types
        # with a topic are accepted then, and only those without otherwise.
        self.partitioned = partitioned
        self._types: dict[type[Any], _TypeFacts] = {}
        self._queues: dict[str, str | None] = {}
        # The queues whose claims keep concurrency keys, read on the first
        # keyed job.
        self._keyed_queues: set[str] | None = None

    def build(
        self, payload: object, options: EnqueueOptions, *, job_id: str | None = None
    ) -> NewJob:
        """Return the row of one job of ``payload``, enqueued as ``options`` say.

        ``job_id`` defaults to a fresh id. Raises NotRegistered, TypeError
        (not a dataclass, or a value it cannot store) or PayloadTooLarge.
        """
        handler, retry_policy = self._type_facts(payload)
        unique = (
            handler.unique_key is not None
            or options.unique_key is not None
            or options.unique_for_ms is not None
        )
        try:
            # Refuse now what the worker could not decode later (e.g. a str in
            # an int field), instead of storing a job that can only fail.
            data = codec.encode_checked(payload, handler.payload_type)
        except codec.PayloadDecodeError as exc:
            raise TypeError(
                f"{exc.args[0]} — the value does not match the annotation of "
                f"{handler.payload_type.__qualname__}"
            ) from exc
        if len(data) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload of {handler.name} encodes to {len(data)} bytes, above "
                f"LATER['MAX_PAYLOAD_BYTES']={self.max_payload_bytes}; store large data "
                "elsewhere and pass a reference"
            )
        queue = self._queue(options.queue or handler.queue)
        job = NewJob(
            # The id's time part is this host's clock: ids stay unique and
            # roughly ordered whatever the clock; every stored time is the
            # database's.
            new_job_id() if job_id is None else job_id,
            self.namespace,
            handler.name,
            data,
            handler.priority if options.priority is None else options.priority,
            retry_policy,
            options.parent_id,
            options.run_at_ms,
            options.delay_ms,
            options.timeout_ms,
            queue,
            parents=options.parent_ids,
        )
        # Unique and keyed jobs only: a plain job's row is made once.
        if unique:
            job = job._replace(**self._unique(payload, handler, options))
        if handler.concurrency is not None:
            job = job._replace(**self._keyed(handler, payload, queue))
        return job

    def _keyed(
        self, handler: registry.Handler, payload: object, queue: str | None
    ) -> dict[str, Any]:
        """The concurrency key and limit of a job whose type has a
        concurrency limit. Its queue must be one whose claims keep
        concurrency limits (a queue some keyed type runs on)."""
        name = name_of(queue)
        if self._keyed_queues is None:
            self._keyed_queues = registry.keyed_queues()
        if name not in self._keyed_queues:
            raise ValueError(
                f"queue={name!r}: jobs of {handler.name} have a concurrency limit, which "
                "only the claims of a queue that a type with one runs on keep "
                f"({', '.join(sorted(self._keyed_queues))}); enqueue it on "
                f"{name_of(handler.queue)!r}"
            )
        return {
            "concurrency_key": limits.key_of(handler.concurrency_key, payload, handler.name),
            "concurrency_limit": handler.concurrency,
        }

    def build_many(
        self, payloads: Sequence[object], options: EnqueueOptions, ids: Sequence[str]
    ) -> Iterator[NewJob]:
        """Yield the row of each payload, with the id of the same index.

        Built as taken, so a writer stores the first while the next are
        encoded. A bad payload raises ``build``'s error, its message
        prefixed with ``payloads[<index>]:``.
        """
        for index, (payload, job_id) in enumerate(zip(payloads, ids, strict=True)):
            try:
                job = self.build(payload, options, job_id=job_id)
            except (TypeError, ValueError) as exc:
                exc.args = (f"payloads[{index}]: {exc}",)
                raise
            yield job

    def _queue(self, name: str | None) -> str | None:
        """The stored queue of a job of queue ``name``, checked once per
        builder and name."""
        if name is None:
            return None
        if self.partitioned:
            raise TypeError(
                f"queue={name!r} does not apply to a partition job: a topic's jobs run in "
                "partition order on partition workers; enqueue without queue="
            )
        if name not in self._queues:
            self._queues[name] = queues.stored(name)
        return self._queues[name]

    def _unique(
        self, payload: object, handler: registry.Handler, options: EnqueueOptions
    ) -> dict[str, Any]:
        """The unique key and window of a job of ``payload``: the enqueue's,
        else its type's (the type's callable given the payload)."""
        key = options.unique_key
        if key is None and handler.unique_key is not None:
            if isinstance(handler.unique_key, str):
                key = handler.unique_key
            else:
                key = handler.unique_key(payload)
                check_unique_key(key, f"the unique_key callable of {handler.name}")
        window = options.unique_for_ms or handler.unique_for_ms
        if key is None:
            if window is not None:
                raise TypeError(
                    "unique_for needs a unique_key: pass unique_key=... too, or give the "
                    "type's @job a unique_key"
                )
            return {}
        if self.partitioned:
            raise TypeError(
                "unique_key does not apply to a partition job: a partition runs every job "
                "it is given, in order; enqueue without unique_key="
            )
        if options.parent_ids is not None:
            raise TypeError(
                "unique_key does not apply to a fan-in job (after= with several parents); "
                "give it one parent, or enqueue it without unique_key="
            )
        if window is not None and window > (retention := conf.millis("DASHBOARD_RETENTION")):
            # A finished job is deleted a retention after it finished: kept
            # that long, it holds its key to the end of any shorter window.
            raise ValueError(
                f"unique_for of {window} ms is longer than LATER['DASHBOARD_RETENTION'] "
                f"({retention} ms), after which finished jobs are deleted and no longer "
                "hold their key; use a shorter unique_for or a longer retention"
            )
        return {"unique_key": key, "unique_for_ms": window}

    def _type_facts(self, payload: object) -> _TypeFacts:
        facts = self._types.get(type(payload))
        if facts is None:
            if not dataclasses.is_dataclass(payload) or isinstance(payload, type):
                raise TypeError(
                    f"payload must be a dataclass instance, got {type(payload).__name__}; "
                    "declare the payload type with @dataclass and register a @job handler "
                    "for it"
                )
            handler = registry.handler_for_payload(payload)
            if (handler.topic is not None) != self.partitioned:
                raise TypeError(_wrong_mode(handler))
            policy = handler.static_policy()
            facts = self._types[type(payload)] = (handler, policy.to_json() if policy else None)
        return facts


def _wrong_mode(handler: registry.Handler) -> str:
    if handler.topic is not None:
        return (
            f"{handler.name} belongs to topic {handler.topic!r}: its jobs run in "
            "partition order, so enqueue it with enqueue_to_partition() (or "
            "enqueue_to_partition_delayed, enqueue_continue_to_partition, "
            "enqueue_to_partition_in)"
        )
    return (
        f"{handler.name} has no topic: enqueue it with enqueue(), or give its @job "
        "a topic=... to run its jobs in partition order"
    )
