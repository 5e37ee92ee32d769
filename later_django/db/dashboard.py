"""Operations of the dashboard: its figures, its lists of jobs and its
actions on jobs (docs/dashboard.md). The database's size differs per vendor."""

from __future__ import annotations

import abc
from typing import Any

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import JobPage, JobQuery, JobSummary, StatRow
from later_django.db.sql import dashboard as dashboard_sql
from later_django.db.sql.dashboard import ListOrder
from later_django.db.statements import Statements

# The last character of the id alphabet (lowercase Crockford base32): a
# prefix padded with it to an id's length is the largest id it starts.
ID_LAST = "z"
ID_LENGTH = 26
# A key value a cursor may hold: 64-bit integers, ids.
INT_BOUND = 1 << 63


class DashboardOperations(Statements):
    """The dashboard's reads and writes."""

    # -- figures ------------------------------------------------------------------------
    def stat_insert(
        self, cursor: CursorWrapper, *, namespace: str, server_id: str, row: StatRow
    ) -> None:
        cursor.execute(
            self._sql(dashboard_sql.STAT_INSERT_SQL),
            [
                namespace,
                server_id,
                row.started,
                row.succeeded,
                row.retried,
                row.failed,
                row.regular_waits,
                row.regular_sum_ms,
                row.regular_max_ms,
                row.partition_waits,
                row.partition_sum_ms,
                row.partition_max_ms,
            ],
        )

    def stats_since(
        self, cursor: CursorWrapper, *, namespace: str, window_ms: int
    ) -> list[tuple[Any, ...]]:
        """The stat rows of the last ``window_ms``; each ends with the database's now."""
        cursor.execute(self._sql(dashboard_sql.STATS_SINCE_SQL), [namespace, window_ms])
        return list(cursor.fetchall())

    def sample_take(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Store the backlog now as a sample of the queue-length graph."""
        cursor.execute(self._sql(dashboard_sql.SAMPLE_TAKE_SQL), [namespace, namespace])
        return int(cursor.rowcount)

    def samples_since(
        self, cursor: CursorWrapper, *, namespace: str, window_ms: int
    ) -> list[tuple[int, ...]]:
        cursor.execute(self._sql(dashboard_sql.SAMPLES_SINCE_SQL), [namespace, window_ms])
        return [tuple(int(v) for v in row) for row in cursor.fetchall()]

    def dashboard_prune(
        self, cursor: CursorWrapper, *, namespace: str, stats_for_ms: int, samples_for_ms: int
    ) -> int:
        """Delete stat rows older than ``stats_for_ms`` and samples older than
        ``samples_for_ms``; return how many rows."""
        cursor.execute(self._sql(dashboard_sql.STATS_PRUNE_SQL), [namespace, stats_for_ms])
        deleted = int(cursor.rowcount)
        cursor.execute(self._sql(dashboard_sql.SAMPLES_PRUNE_SQL), [namespace, samples_for_ms])
        return deleted + int(cursor.rowcount)

    def lane_counts(self, cursor: CursorWrapper, *, namespace: str) -> dict[tuple[str, str], int]:
        """Jobs per (lane, stage), from the counters."""
        cursor.execute(self._sql(dashboard_sql.LANE_COUNTS_SQL), [namespace])
        return {(lane, stage): int(n) for lane, stage, n in cursor.fetchall()}

    def live_servers(
        self, cursor: CursorWrapper, *, namespace: str, within_ms: int
    ) -> list[tuple[Any, ...]]:
        """Servers with a heartbeat in the last ``within_ms``; each row ends with now."""
        cursor.execute(self._sql(dashboard_sql.SERVERS_SQL), [namespace, within_ms])
        return list(cursor.fetchall())

    def running_jobs(
        self, cursor: CursorWrapper, *, namespace: str, limit: int
    ) -> list[tuple[Any, ...]]:
        cursor.execute(self._sql(dashboard_sql.RUNNING_JOBS_SQL), [namespace, limit])
        return list(cursor.fetchall())

    def log_consumers(self, cursor: CursorWrapper, *, namespace: str) -> list[tuple[Any, ...]]:
        """(topic, group, partition, committed, next offset, member, epoch,
        lease expiry, now) of every retained-log consumer."""
        cursor.execute(self._sql(dashboard_sql.LOG_CONSUMERS_SQL), [namespace])
        return list(cursor.fetchall())

    @abc.abstractmethod
    def database_size(self, cursor: CursorWrapper) -> int:
        """The whole database's size on disk in bytes, later's tables and the
        application's alike."""

    # -- jobs -----------------------------------------------------------------------------
    def job_detail(
        self, cursor: CursorWrapper, *, namespace: str, job_id: str
    ) -> dict[str, Any] | None:
        cursor.execute(self._sql(dashboard_sql.JOB_DETAIL_SQL), [job_id, namespace])
        row = cursor.fetchone()
        if row is None:
            return None
        names = [c.strip() for c in dashboard_sql.DETAIL_COLUMNS.split(",")]
        return dict(zip(names, row, strict=True))

    def job_children(self, cursor: CursorWrapper, *, job_id: str, limit: int) -> list[JobSummary]:
        cursor.execute(self._sql(dashboard_sql.JOB_CHILDREN_SQL), [job_id, limit])
        return [_summary(row) for row in cursor.fetchall()]

    def job_page(self, cursor: CursorWrapper, query: JobQuery) -> JobPage:
        """A page of the list ``query`` asks for, read in its index's order
        from its cursor on: a page costs the same however deep it is."""
        order, where, params = _source(query)
        base = f"FROM later_job WHERE namespace = %s AND {order.where}{where}"
        base_params = [query.namespace, *params]
        key_names = ", ".join(col for col, _ in order.keys)
        checks = _filters(query, order)
        if not checks:
            rows = self._stretch(
                cursor,
                f"{dashboard_sql.SUMMARY_COLUMNS}, {key_names}",
                (base, base_params),
                order,
                query.after,
                query.page_size + 1,
            )
            more = len(rows) > query.page_size
            rows = rows[: query.page_size]
            after = _key(rows[-1], order) if more else None
            return JobPage([_summary(row) for row in rows], after, scanned_out=False)
        # Terms the index cannot serve are checked on a bounded stretch of
        # it (narrow rows), and the page's matches read by id.
        names = [name for name, _ in checks]
        rows = self._stretch(
            cursor,
            f"id, {', '.join(names)}, {key_names}",
            (base, base_params),
            order,
            query.after,
            query.scan_limit,
        )
        matches = [row for row in rows if all(row[1 + i] == v for i, (_, v) in enumerate(checks))]
        if len(matches) > query.page_size:
            matches = matches[: query.page_size]
            after, scanned_out = _key(matches[-1], order), False
        elif len(rows) == query.scan_limit:
            after, scanned_out = _key(rows[-1], order), True
        else:
            after, scanned_out = None, False
        return JobPage(self._summaries(cursor, [row[0] for row in matches]), after, scanned_out)

    def _stretch(
        self,
        cursor: CursorWrapper,
        columns: str,
        base: tuple[str, list[Any]],
        order: ListOrder,
        after: tuple[Any, ...] | None,
        limit: int,
    ) -> list[tuple[Any, ...]]:
        """Up to ``limit`` rows of the list after ``after``, in its order.

        After a cursor (x, y) the rows are those with the key x and a later
        y, then those with a later x: two reads that each start where they
        begin in the index, where one read with "k0 > x OR (k0 = x AND
        k1 > y)" would walk the index from its start on PostgreSQL."""
        sql, params = base
        by = ", ".join(f"{col} DESC" if desc else col for col, desc in order.keys)
        rows: list[tuple[Any, ...]] = []
        for term, term_params in _segments(order, after):
            cursor.execute(
                f"SELECT {columns} {sql}{term} ORDER BY {by} LIMIT %s",
                [*params, *term_params, limit - len(rows)],
            )
            rows.extend(cursor.fetchall())
            if len(rows) >= limit:
                break
        return rows

    def _summaries(self, cursor: CursorWrapper, ids: list[str]) -> list[JobSummary]:
        """The jobs ``ids``, in that order."""
        if not ids:
            return []
        placeholders = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"SELECT {dashboard_sql.SUMMARY_COLUMNS} FROM later_job WHERE id IN ({placeholders})",
            ids,
        )
        found = {row[0]: _summary(row) for row in cursor.fetchall()}
        return [found[job_id] for job_id in ids if job_id in found]

    # -- actions -------------------------------------------------------------------------
    def job_retry_failed(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> int | None:
        """Make the failed plain job ``job_id`` ready again, and its
        continuations that failed because it did wait for it again; return
        how many continuations, or None if the job was not a failed plain job.
        Run in one transaction."""
        cursor.execute(self._sql(dashboard_sql.JOB_RETRY_FAILED_SQL), [job_id, namespace])
        if cursor.rowcount != 1:
            return None
        cursor.execute(self._sql(dashboard_sql.JOB_REVIVE_DESCENDANTS_SQL), [job_id])
        return int(cursor.rowcount)

    def job_run_now(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> bool:
        """Make a delayed or requeued job due now; return whether it was one."""
        cursor.execute(self._sql(dashboard_sql.JOB_RUN_NOW_SQL), [job_id, namespace])
        return bool(cursor.rowcount == 1)


def _source(query: JobQuery) -> tuple[ListOrder, str, list[Any]]:
    """The index the list reads, with the terms of ``query`` it serves."""
    if query.id_prefix is not None:
        end = query.id_prefix.ljust(ID_LENGTH, ID_LAST)
        return dashboard_sql.BY_ID, "", [query.id_prefix, end]
    stage = query.stage
    if query.topic is not None and stage not in ("success", "failed", "cancelled"):
        if query.partition is None:
            return dashboard_sql.PARTITION, " AND topic = %s", [query.topic]
        return (
            dashboard_sql.PARTITION,
            " AND topic = %s AND partition = %s",
            [query.topic, query.partition],
        )
    if stage == "enqueued":
        return dashboard_sql.READY, "", []
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
    if query.stage is not None and order in (
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
    )
