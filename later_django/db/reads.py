"""The read models: exact counts per stage (``later_stage_count``, kept by
triggers in the same transaction as every change of a job), the
dashboard's figures and lists of jobs (docs/how-to/dashboard.md), and lookups.
Both vendors run the same statements; the operator's actions on jobs are
the control store's (db/control.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db.backends.utils import CursorWrapper

from later_django import queue_names
from later_django.db.rows import (
    CounterDrift,
    JobDetail,
    JobPage,
    JobParent,
    JobQuery,
    JobSummary,
    LaneCount,
    LiveServer,
    LogConsumerRow,
    QueueSample,
    RunningJob,
    ServerBeat,
    ServerBeats,
    StatReading,
    StatRow,
    UnleasedJob,
    UnleasedRunning,
)
from later_django.db.rows.dashboard import RECENT, QueueStateRow
from later_django.db.sql import counters as counters_sql
from later_django.db.sql import dashboard as dashboard_sql
from later_django.db.sql import health as health_sql
from later_django.db.sql.dashboard import ListOrder
from later_django.db.statements import Operations
from later_django.states import Stage

# The last character of the id alphabet (lowercase Crockford base32): a
# prefix padded with it to an id's length is the largest id it starts.
ID_LAST = "z"
ID_LENGTH = 26
# A key value a cursor may hold: 64-bit integers, ids.
INT_BOUND = 1 << 63


class ReadModels(Operations):
    """Counts, figures, lists and lookups; the figures' own upkeep."""

    # -- counts -------------------------------------------------------------------------
    def stage_counts(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, int]:
        """The number of jobs of ``namespace`` per stage, every stage present."""
        self._run(cursor, counters_sql.STAGE_COUNTS, namespace=namespace)
        counts = {stage.value: 0 for stage in Stage}
        for stage, n in cursor.fetchall():
            counts[stage] = int(n)
        return counts

    def plain_ready(self, cursor: CursorWrapper, *, namespace: str, queue: str = "default") -> int:
        """Plain jobs of ``namespace`` in queue ``queue`` ready to run now (0
        while it is paused)."""
        lane = queue_names.lane_of(queue)
        self._run(cursor, counters_sql.QUEUE_READY, namespace=namespace, lane=lane, queue=queue)
        return int(cursor.fetchone()[0])

    # -- figures ------------------------------------------------------------------------
    def stat_insert(
        self, cursor: CursorWrapper, *, namespace: str, server_id: str, row: StatRow
    ) -> None:
        self._run(
            cursor,
            dashboard_sql.STAT_INSERT,
            namespace=namespace,
            server_id=server_id,
            started=row.started,
            succeeded=row.succeeded,
            retried=row.retried,
            failed=row.failed,
            regular_waits=row.regular_waits,
            regular_sum_ms=row.regular_sum_ms,
            regular_max_ms=row.regular_max_ms,
            partition_waits=row.partition_waits,
            partition_sum_ms=row.partition_sum_ms,
            partition_max_ms=row.partition_max_ms,
        )

    def stats_since(
        self, cursor: CursorWrapper, *, namespace: str, window_ms: int
    ) -> list[StatReading]:
        """The stat rows written in the last ``window_ms``."""
        self._run(cursor, dashboard_sql.STATS_SINCE, namespace=namespace, window_ms=window_ms)
        return [StatReading(int(row[0]), StatRow(*row[1:])) for row in cursor.fetchall()]

    def sample_take(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Store the backlog now as a sample of the queue-length graph."""
        self._run(cursor, dashboard_sql.SAMPLE_TAKE, namespace=namespace)
        return int(cursor.rowcount)

    def samples_since(
        self, cursor: CursorWrapper, *, namespace: str, window_ms: int, step_ms: int
    ) -> list[QueueSample]:
        """The samples of the last ``window_ms``, a point per ``step_ms``
        (each the largest of its stretch), oldest first."""
        self._run(
            cursor,
            dashboard_sql.SAMPLES_SINCE,
            namespace=namespace,
            window_ms=window_ms,
            step_ms=step_ms,
        )
        return [QueueSample(*(int(v) for v in row)) for row in cursor.fetchall()]

    def dashboard_prune(
        self, cursor: CursorWrapper, *, namespace: str, stats_for_ms: int, samples_for_ms: int
    ) -> int:
        """Delete stat rows older than ``stats_for_ms`` and samples older than
        ``samples_for_ms``; return how many rows."""
        self._run(cursor, dashboard_sql.STATS_PRUNE, namespace=namespace, kept_ms=stats_for_ms)
        deleted = int(cursor.rowcount)
        self._run(cursor, dashboard_sql.SAMPLES_PRUNE, namespace=namespace, kept_ms=samples_for_ms)
        return deleted + int(cursor.rowcount)

    def lane_counts(self, cursor: CursorWrapper, *, namespace: str) -> list[LaneCount]:
        """Jobs per lane and stage, from the counters."""
        self._run(cursor, dashboard_sql.LANE_COUNTS, namespace=namespace)
        return [LaneCount(lane, stage, int(n)) for lane, stage, n in cursor.fetchall()]

    def live_servers(
        self, cursor: CursorWrapper, *, namespace: str, within_ms: int
    ) -> list[LiveServer]:
        """Servers with a heartbeat in the last ``within_ms``."""
        self._run(cursor, dashboard_sql.SERVERS, namespace=namespace, within_ms=within_ms)
        return [
            LiveServer(sid, host, pid, workers, bool(topics), started, beat, queues, version)
            for sid, host, pid, workers, topics, started, beat, queues, version in cursor.fetchall()
        ]

    def queue_states(self, cursor: CursorWrapper, *, namespace: str) -> list[QueueStateRow]:
        """Every queue of ``namespace`` with a row in later_queue (paused at
        least once), by name."""
        self._run(cursor, dashboard_sql.QUEUE_STATES, namespace=namespace)
        return [
            QueueStateRow(name, bool(paused), int(changed), window_end, started)
            for name, paused, changed, window_end, started in cursor.fetchall()
        ]

    def running_jobs(
        self, cursor: CursorWrapper, *, namespace: str, limit: int
    ) -> list[RunningJob]:
        """Up to ``limit`` running jobs, the longest running first."""
        self._run(cursor, dashboard_sql.RUNNING_JOBS, namespace=namespace, limit=limit)
        return [RunningJob(*row) for row in cursor.fetchall()]

    def log_consumers(self, cursor: CursorWrapper, *, namespace: str) -> list[LogConsumerRow]:
        """Every retained-log consumer group's place in every partition."""
        self._run(cursor, dashboard_sql.LOG_CONSUMERS, namespace=namespace)
        return [LogConsumerRow(*row) for row in cursor.fetchall()]

    # -- jobs -----------------------------------------------------------------------------
    def job_detail(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> JobDetail | None:
        """The job ``job_id`` of ``namespace`` without its payload, or None."""
        self._run(cursor, dashboard_sql.JOB_DETAIL, job_id=job_id, namespace=namespace)
        row = cursor.fetchone()
        if row is None:
            return None
        detail = JobDetail(*row)
        return dataclasses.replace(detail, queue=queue_names.name_of(detail.queue))

    def job_children(self, cursor: CursorWrapper, *, job_id: str, limit: int) -> list[JobSummary]:
        """Up to ``limit`` continuations of ``job_id`` in id order, fan-in
        children waiting on another of their parents included."""
        self._run(cursor, dashboard_sql.JOB_CHILDREN, job_id=job_id, limit=limit)
        return [_summary(row) for row in cursor.fetchall()]

    def job_parents(self, cursor: CursorWrapper, *, job_id: str) -> list[JobParent]:
        """Every parent of the fan-in job ``job_id`` in id order (none for
        any other job), each with its job while it is kept."""
        self._run(cursor, dashboard_sql.JOB_PARENTS, job_id=job_id)
        return [
            JobParent(str(row[0]), None if row[1] is None else _summary(row[1:]))
            for row in cursor.fetchall()
        ]

    def job_page(self, cursor: CursorWrapper, query: JobQuery) -> JobPage:
        """A page of the list ``query`` asks for, read in its index's order
        from its cursor on: a page costs the same however deep it is.

        After a cursor (x, y) the list goes on with the rows of key x and a
        later y, then those of a later x: two reads that each start where
        their rows begin in the index, where one read with "k0 > x OR (k0 = x
        AND k1 > y)" would walk the index from its start on PostgreSQL.
        Terms the index cannot serve (a type, say) are checked, inside the
        database, on a stretch of at most ``scan_limit`` of its entries per
        read: a page then says where it stopped, and the next goes on."""
        order, where, params = _source(query)
        # The list's own terms before the index's predicate: SQLite then
        # searches the attention index by stage and reads it in order,
        # instead of planning on the IN list and sorting the whole index.
        # (Only one of the two takes parameters.)
        predicate = f" AND {order.where}" if order.where else ""
        base = f"FROM later_job WHERE namespace = %s{where}{predicate}"
        by = ", ".join(f"{col} DESC" if desc else col for col, desc in order.keys)
        keys = ", ".join(f"{col} AS k{i}" for i, (col, _) in enumerate(order.keys))
        checks = _filters(query, order)
        limit = query.page_size + 1
        rows: list[tuple[Any, ...]] = []
        for term, term_params in _segments(order, after=query.after):
            head = [query.namespace, *params, *term_params]
            if not checks:
                cursor.execute(
                    f"SELECT {dashboard_sql.SUMMARY_COLUMNS}, {keys} {base}{term} "
                    f"ORDER BY {by} LIMIT %s",
                    [*head, limit - len(rows)],
                )
                rows.extend(cursor.fetchall())
            else:
                # No ORDER BY outside: both databases read a subquery in FROM in
                # its own order (a SQLite co-routine, a PostgreSQL subquery
                # scan), so the first matches are the page, and the read stops
                # there. An outer ORDER BY would make SQLite sort the whole
                # stretch first.
                cursor.execute(
                    f"SELECT * FROM (SELECT {dashboard_sql.SUMMARY_COLUMNS}, {keys} {base}{term} "
                    f"ORDER BY {by} LIMIT %s) s "
                    f"WHERE {' AND '.join(f'{name} = %s' for name, _ in checks)} LIMIT %s",
                    [*head, query.scan_limit, *(value for _, value in checks), limit - len(rows)],
                )
                rows.extend(cursor.fetchall())
                if len(rows) < limit:
                    # Did the stretch end the read's rows, or do more follow?
                    cursor.execute(
                        f"SELECT {keys} {base}{term} ORDER BY {by} LIMIT 1 OFFSET %s",
                        [*head, query.scan_limit - 1],
                    )
                    last = cursor.fetchone()
                    if last is not None:
                        return JobPage([_summary(r) for r in rows], tuple(last), scanned_out=True)
            if len(rows) >= limit:
                break
        more = len(rows) > query.page_size
        rows = rows[: query.page_size]
        after = _key(rows[-1], order) if more else None
        return JobPage([_summary(row) for row in rows], after, scanned_out=False)

    # -- health (later_health) ----------------------------------------------------------
    def server_beats(self, cursor: CursorWrapper, *, namespace: str) -> ServerBeats:
        """Every server of ``namespace``, fresh or not, and the database's clock."""
        self._run(cursor, health_sql.SERVER_BEATS, namespace=namespace)
        rows = cursor.fetchall()
        return ServerBeats(
            int(rows[0][0]),
            tuple(
                ServerBeat(sid, host, int(pid), version, int(beat))
                for _, sid, host, pid, version, beat in rows
                if sid is not None
            ),
        )

    def counter_drift(self, cursor: CursorWrapper, *, namespace: str) -> list[CounterDrift]:
        """Each (stage, lane) of ``namespace`` whose counter differs from its
        rows, but 'success' (reading those would read the table: see
        sql/health.py); empty when they agree."""
        self._run(cursor, health_sql.COUNTER_DRIFT, namespace=namespace)
        return [
            CounterDrift(stage, lane, int(counted), int(found))
            for stage, lane, counted, found in cursor.fetchall()
        ]

    def running_unleased(
        self, cursor: CursorWrapper, *, namespace: str, overdue_ms: int
    ) -> UnleasedRunning:
        """Running jobs of ``namespace`` without a lease, or whose lease
        expired more than ``overdue_ms`` ago."""
        self._run(
            cursor,
            health_sql.RUNNING_UNLEASED_COUNT,
            namespace=namespace,
            expired_for_ms=overdue_ms,
        )
        count = int(cursor.fetchone()[0])
        if not count:
            return UnleasedRunning(0, ())
        self._run(
            cursor, health_sql.RUNNING_UNLEASED, namespace=namespace, expired_for_ms=overdue_ms
        )
        return UnleasedRunning(
            count,
            tuple(
                UnleasedJob(job_id, owner, None if age is None else int(age))
                for job_id, owner, age in cursor.fetchall()
            ),
        )


def _source(query: JobQuery) -> tuple[ListOrder, str, list[Any]]:
    """The index the list reads, with the terms of ``query`` it serves."""
    if query.id_prefix is not None:
        end = query.id_prefix.ljust(ID_LENGTH, ID_LAST)
        return dashboard_sql.BY_ID, "", [query.id_prefix, end]
    stage = query.stage
    if stage == RECENT:
        return dashboard_sql.RECENT, "", []
    if query.topic is not None and stage not in ("success", "failed", "cancelled"):
        if query.partition is None:
            return dashboard_sql.PARTITION, " AND topic = %s", [query.topic]
        return (
            dashboard_sql.PARTITION,
            " AND topic = %s AND partition = %s",
            [query.topic, query.partition],
        )
    if stage == "enqueued":
        queue = queue_names.column_value(query.queue or queue_names.DEFAULT_QUEUE)
        return dashboard_sql.READY, " AND queue = %s", [queue]
    if stage in ("delayed", "requeued"):
        return dashboard_sql.DUE, "", []
    if stage == "running":
        return dashboard_sql.RUNNING, "", []
    if stage == "success":
        return dashboard_sql.FINISHED, "", []
    return dashboard_sql.ATTENTION, f" AND stage = '{_checked_stage(stage)}'", []


def _checked_stage(stage: str | None) -> str:
    if stage not in ("waiting", "failed", "cancelled"):
        raise ValueError(f"unknown stage {stage!r}")
    return stage


def _filters(query: JobQuery, order: ListOrder) -> list[tuple[str, Any]]:
    """The (column, value) terms of ``query`` its index does not serve."""
    checks: list[tuple[str, Any]] = []
    if query.stage not in (None, RECENT) and order in (
        dashboard_sql.PARTITION,
        dashboard_sql.DUE,
        dashboard_sql.FINISHED,
        dashboard_sql.BY_ID,
    ):
        checks.append(("stage", query.stage))
    if query.type_name is not None:
        checks.append(("type_name", query.type_name))
    if query.topic is not None and order is not dashboard_sql.PARTITION:
        checks.append(("topic", query.topic))
        if query.partition is not None:
            checks.append(("partition", query.partition))
    return checks


def _segments(order: ListOrder, after: tuple[Any, ...] | None) -> list[tuple[str, list[Any]]]:
    """The terms that, read one after the other, give the rows after
    ``after`` in the list's order: for keys (k0, k1), "k0 = x AND k1 > y",
    then "k0 > x" (with < for a descending key)."""
    if after is None:
        return [("", [])]
    if len(after) != len(order.keys) or not all(
        _fits(col, value) for (col, _), value in zip(order.keys, after, strict=True)
    ):
        raise ValueError("the cursor 'after' does not belong to this list: follow its Next link")
    segments = []
    for i in range(len(order.keys) - 1, -1, -1):
        col, desc = order.keys[i]
        equal = "".join(f" AND {c} = %s" for c, _ in order.keys[:i])
        segments.append((f"{equal} AND {col} {'<' if desc else '>'} %s", [*after[: i + 1]]))
    return segments


def _fits(column: str, value: Any) -> bool:
    """Can ``value`` be a key value of ``column``: an id, or a 64-bit int?"""
    if column == "id":
        return type(value) is str
    return type(value) is int and -INT_BOUND <= value < INT_BOUND


def _key(row: tuple[Any, ...], order: ListOrder) -> tuple[Any, ...]:
    return tuple(row[-len(order.keys) :])


def _summary(row: tuple[Any, ...]) -> JobSummary:
    job_id, type_name, stage, priority, attempts, created, run_at, changed, topic, part, seq = row[
        :11
    ]
    return JobSummary(
        job_id,
        type_name,
        stage,
        priority,
        attempts,
        created,
        run_at,
        changed,
        topic,
        part,
        seq,
        bool(row[11]),
        queue_names.name_of(row[12]),
    )
