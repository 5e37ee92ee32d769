"""The dashboard's lists of jobs and its job page, on SQLite and PostgreSQL:
each stage's list holds exactly that stage's jobs in the documented order,
pages with a keyset cursor visit every job once, filters the index cannot
serve stop at their scan limit and go on from there, a topic and partition
list its unfinished jobs by sequence, an id prefix finds its jobs, bad
filters are refused with a message, and the job page shows durations,
history, parent and continuations.

Lists are read through ``reads.job_page`` with small pages (the pages and
JSON serve 50 a page) and checked against a sort of the rows done here."""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db import connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import later_django as later
from later_django.dashboard import reads
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, JobPage, JobQuery
from later_django.partitions.hashing import partition_for_key
from later_django.testing import drain
from tests.helpers import LaterDb, history_stages, set_later
from tests.jobapp.jobs import Digest, Noop, NoRetry, Order, Ordered, Refresh

# Django's version changes nothing in what these check (later's SQL and
# actions): they run in the first tox env only (tox.ini), like the process tests.
pytestmark = pytest.mark.one_env

BASE = "/admin/later/"
HOUR = timedelta(hours=1)
NOOP = "tests.jobapp.jobs.Noop"
STAGES = ("enqueued", "delayed", "waiting", "running", "requeued", "success", "failed", "cancelled")
TOPICS = {"ordered": 4}


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


@pytest.fixture
def viewer(later_db: LaterDb) -> Client:
    """A staff user allowed to view the dashboard (a 500 is a status, not an exception)."""
    user = User.objects.create(username="viewer", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="later_django", codename="view_dashboard")
    )
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _json(client: Client, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, (url, response.content[:500])
    return json.loads(response.content)


def pages(query: JobQuery) -> list[JobPage]:
    """Every page of ``query``'s list, following its cursor to the end."""
    found = []
    while True:
        page = reads.job_page(query)
        found.append(page)
        if page.after is None:
            return found
        assert len(found) < 100, "the cursor goes on for ever"
        query = JobQuery(**{**_fields(query), "after": page.after})


def _fields(query: JobQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in JobQuery.__dataclass_fields__}


def listed(query: JobQuery) -> list[str]:
    """The ids of every page of ``query``'s list, in order; each page holds at
    most a page of jobs and the list visits no job twice."""
    ids = []
    for page in pages(query):
        assert len(page.jobs) <= query.page_size
        ids += [job.id for job in page.jobs]
    assert len(ids) == len(set(ids)), "a job was listed twice"
    return ids


def _set(later_db: LaterDb, job_id: str, **columns: object) -> None:
    assignments = ", ".join(f"{name} = %s" for name in columns)
    changed = later_db.execute(
        f"UPDATE later_job SET {assignments} WHERE id = %s", [*columns.values(), job_id]
    )
    assert changed == 1


def _claim(later_db: LaterDb, limit: int) -> list[str]:
    """Claim up to ``limit`` ready jobs as a worker does; return their ids."""
    dialect = dialect_for(later_db.alias)
    with (
        transaction.atomic(using=later_db.alias),
        connections[later_db.alias].cursor() as cursor,
    ):
        claimed = dialect.hot.claim(
            cursor,
            ClaimRequest(namespace="default", owner="test-owner", limit=limit, lease_ms=60_000),
        )
    return [job.id for job in claimed]


# Each list's order, as this module sorts the rows: a key (ids are unique, so
# no tie is left) and whether the list reads it from the largest down.
ORDERS: dict[str, tuple[Callable[[dict[str, Any]], Any], bool]] = {
    "enqueued": (lambda r: (-r["priority"], r["id"]), False),
    "delayed": (lambda r: (r["run_at_ms"], r["id"]), False),
    "requeued": (lambda r: (r["run_at_ms"], r["id"]), False),
    "running": (lambda r: (r["lease_expires_ms"], r["id"]), False),
    "success": (lambda r: (r["expires_ms"], r["id"]), True),
    "failed": (lambda r: (r["changed_ms"], r["id"]), True),
    "cancelled": (lambda r: (r["changed_ms"], r["id"]), True),
    "waiting": (lambda r: (r["changed_ms"], r["id"]), True),
}


def expected_list(later_db: LaterDb, stage: str) -> list[str]:
    columns = ["id", "priority", "run_at_ms", "lease_expires_ms", "expires_ms", "changed_ms"]
    rows = [
        dict(zip(columns, row, strict=True))
        for row in later_db.rows(
            f"SELECT {', '.join(columns)} FROM later_job WHERE stage = %s AND topic IS NULL",
            [stage],
        )
    ]
    key, descending = ORDERS[stage]
    return [r["id"] for r in sorted(rows, key=key, reverse=descending)]


def seed_every_stage(later_db: LaterDb) -> dict[str, list[str]]:
    """Plain jobs in every stage, with the columns each list sorts by set to
    values that are not in id order and that tie, so the order is the list's
    own; return the ids per stage."""
    base = later_db.now_ms()
    jobs: dict[str, list[str]] = {}
    jobs["success"] = later.enqueue_many(Noop(n=i) for i in range(5))
    jobs["failed"] = [later.enqueue(NoRetry()) for _ in range(4)]
    drain()
    jobs["cancelled"] = later.enqueue_many(Noop(n=10 + i) for i in range(4))
    for job_id in jobs["cancelled"]:
        assert later.cancel(job_id)
    # Running: claimed, as a worker would, ahead of the enqueued ones (priority).
    running = later.enqueue_many((Noop(n=20 + i) for i in range(4)), priority=100)
    jobs["running"] = sorted(_claim(later_db, 4))
    assert sorted(running) == jobs["running"]
    priorities = [0, 5, 0, 9, 5, 0, -3]
    jobs["enqueued"] = [later.enqueue(Noop(n=30 + i), priority=p) for i, p in enumerate(priorities)]
    jobs["delayed"] = [later.enqueue_delayed(Noop(n=40 + i), HOUR) for i in range(5)]
    jobs["requeued"] = [later.enqueue_delayed(Noop(n=50 + i), HOUR) for i in range(4)]
    parent = jobs["delayed"][0]
    jobs["waiting"] = [later.enqueue_continue(parent, Noop(n=60 + i)) for i in range(4)]

    # Later ids get earlier (or equal) keys: the order is never the ids'.
    offsets = [7, 3, 3, 9, 1, 5, 2]
    for i, job_id in enumerate(jobs["success"]):
        expires = base + 10_000_000 - offsets[i] * 1000
        _set(later_db, job_id, expires_ms=expires, finished_ms=expires - 1_000_000)
    for stage in ("failed", "cancelled"):
        for i, job_id in enumerate(jobs[stage]):
            # Finished later than any success: first in the finished jobs' index.
            _set(later_db, job_id, changed_ms=base - offsets[i], expires_ms=base + 20_000_000 + i)
    for i, job_id in enumerate(jobs["waiting"]):
        _set(later_db, job_id, changed_ms=base - offsets[i])
    for i, job_id in enumerate(jobs["running"]):
        _set(later_db, job_id, lease_expires_ms=base + 60_000 - offsets[i])
    for i, job_id in enumerate(jobs["delayed"]):
        _set(later_db, job_id, run_at_ms=base + 3_600_000 - offsets[i] * 1000)
    for i, job_id in enumerate(jobs["requeued"]):
        _set(later_db, job_id, stage="requeued", run_at_ms=base + 1000 * offsets[i])
    counts = later.stage_counts()
    assert {stage: counts[stage] for stage in STAGES} == {s: len(jobs[s]) for s in STAGES}
    return jobs


# -- each stage's list ----------------------------------------------------------------
def test_each_stage_lists_exactly_its_jobs_in_order_a_page_at_a_time(
    later_db: LaterDb, viewer: Client
) -> None:
    jobs = seed_every_stage(later_db)
    for stage in STAGES:
        expected = expected_list(later_db, stage)
        assert sorted(expected) == sorted(jobs[stage]), stage
        query = JobQuery(namespace="default", stage=stage, page_size=3)
        found = pages(query)
        assert len(found) == math.ceil(len(expected) / 3), stage
        assert [j.id for p in found for j in p.jobs] == expected, stage
        assert {j.stage for p in found for j in p.jobs} == {stage}
        assert not any(p.scanned_out for p in found)

        page = _json(viewer, f"{BASE}api/jobs?stage={stage}")
        assert [j["id"] for j in page["jobs"]] == expected, stage
        assert page["next"] is None and page["scanned_out"] is False
        content = viewer.get(f"{BASE}jobs/?stage={stage}").content.decode()
        rows = re.findall(r'<tr data-job-id="([0-9a-z]{26})">', content)
        assert rows == expected, stage

    finished = dict(later_db.rows("SELECT id, finished_ms FROM later_job WHERE stage = 'success'"))
    times = [finished[job_id] for job_id in expected_list(later_db, "success")]
    assert times == sorted(times, reverse=True), "latest finished first"


def test_the_json_list_pages_with_its_next_cursor(later_db: LaterDb, viewer: Client) -> None:
    ids = later.enqueue_many(Noop(n=i) for i in range(53))
    ids += later.enqueue_many((Noop(n=i) for i in range(4)), priority=3)
    expected = expected_list(later_db, "enqueued")
    first = _json(viewer, f"{BASE}api/jobs?stage=enqueued")
    assert len(first["jobs"]) == 50 and first["next"]
    second = _json(viewer, f"{BASE}api/jobs?stage=enqueued&after={first['next']}")
    assert second["next"] is None
    assert [j["id"] for j in first["jobs"] + second["jobs"]] == expected
    assert sorted(expected) == sorted(ids)
    # The page's Next link carries the same cursor and the filter.
    content = html.unescape(viewer.get(f"{BASE}jobs/?stage=enqueued").content.decode())
    assert f'href="?stage=enqueued&after={first["next"]}"' in content


# -- the recent list -------------------------------------------------------------------
def test_the_recent_list_holds_every_job_newest_first_and_is_the_default(
    later_db: LaterDb, viewer: Client, settings: Any
) -> None:
    """With no stage, the list is "recent": every job of every stage (a
    topic's too) in descending id order, which is creation order, a page at
    a time; it is first in the stage menu, and a type filter applies to it."""
    set_later(settings, TOPICS=TOPICS)
    jobs = seed_every_stage(later_db)
    partitioned = [later.enqueue_to_partition(Ordered(f"key-{i}", 0)) for i in range(3)]
    every = sorted([*(j for ids in jobs.values() for j in ids), *partitioned], reverse=True)
    created = dict(later_db.rows("SELECT id, created_ms FROM later_job"))
    assert [created[j] for j in every] == sorted(created.values(), reverse=True)

    recent = JobQuery(namespace="default", stage="recent", page_size=4)
    found = pages(recent)
    assert len(found) == math.ceil(len(every) / 4)
    assert [j.id for p in found for j in p.jobs] == every
    assert not any(p.scanned_out for p in found)
    noops = [j for j in every if j not in jobs["failed"] and j not in partitioned]
    by_type = JobQuery(
        namespace="default", stage="recent", type_name=NOOP, page_size=3, scan_limit=5
    )
    assert [j.id for p in pages(by_type) for j in p.jobs] == noops

    for url in (f"{BASE}api/jobs", f"{BASE}api/jobs?stage=recent"):
        page = _json(viewer, url)
        assert [j["id"] for j in page["jobs"]] == every, url
    content = viewer.get(f"{BASE}jobs/").content.decode()
    assert re.findall(r'<tr data-job-id="([0-9a-z]{26})">', content) == every
    menu = re.search(r'<nav class="later-stages".*?</nav>', content, re.S)
    assert menu is not None
    entries = re.findall(r'<a href="\?([^"]*)"( aria-current="page")?>(\w+) ', menu.group(0))
    assert [name for _, _, name in entries] == ["recent", *STAGES]
    assert entries[0][:2] == ("stage=recent", ' aria-current="page"')
    assert f'data-stage-count="recent">{len(every)}<' in content


def test_the_recent_list_reads_the_primary_key_in_its_order(later_db: LaterDb) -> None:
    """A page of the recent list, the first or one after a cursor, walks the
    primary key backwards from where it starts: no sort, no other index,
    however many jobs there are."""
    ids = later.enqueue_many(Noop(n=i) for i in range(3000))
    connection = connections[later_db.alias]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    explain = "EXPLAIN QUERY PLAN " if later_db.vendor == "sqlite" else "EXPLAIN "
    for after in (None, (str(ids[1500]),)):
        with CaptureQueriesContext(connection) as captured:
            page = reads.job_page(JobQuery(namespace="default", stage="recent", after=after))
        assert len(page.jobs) == 50 and page.after is not None
        [statement] = [q["sql"] for q in captured.captured_queries]
        with connection.cursor() as cursor:
            cursor.execute(explain + statement)
            plan = "\n".join(
                str(row[-1]) if later_db.vendor == "sqlite" else row[0] for row in cursor.fetchall()
            )
        if later_db.vendor == "sqlite":
            assert "USING INDEX sqlite_autoindex_later_job_1" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
        else:
            assert "Index Scan Backward using later_job_pkey" in plan, plan
            assert "Sort" not in plan, plan


def test_a_queues_ready_list_reads_the_ready_index_in_its_order(
    later_db: LaterDb, settings: Any
) -> None:
    """Each queue's ready jobs are a run of the ready index of their own: a
    page of one queue's list, the first or after a cursor, reads that run in
    order, with no sort, however many jobs the other queues hold."""
    set_later(settings, QUEUES={"default": {}, "emails": {}})
    later.enqueue_many(Noop(n=i) for i in range(1500))
    emails = later.enqueue_many((Noop(n=i) for i in range(1500)), queue="emails")
    connection = connections[later_db.alias]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    explain = "EXPLAIN QUERY PLAN " if later_db.vendor == "sqlite" else "EXPLAIN "
    for queue in (None, "emails"):
        first = reads.job_page(JobQuery(namespace="default", stage="enqueued", queue=queue))
        assert len(first.jobs) == 50 and first.after is not None
        assert {job.queue for job in first.jobs} == {queue or "default"}
        for after in (None, first.after):
            query = JobQuery(namespace="default", stage="enqueued", queue=queue, after=after)
            with CaptureQueriesContext(connection) as captured:
                page = reads.job_page(query)
            assert len(page.jobs) == 50
            statements = [q["sql"] for q in captured.captured_queries]
            for statement in statements:
                with transaction.atomic(using=later_db.alias), connection.cursor() as cursor:
                    if later_db.vendor == "postgresql":
                        # A table this small is read whole at any plan's cost;
                        # what matters is that the index gives the order.
                        for scan in ("seqscan", "bitmapscan", "sort"):
                            cursor.execute(f"SET LOCAL enable_{scan} = off")
                    cursor.execute(explain + statement)
                    plan = "\n".join(
                        str(row[-1]) if later_db.vendor == "sqlite" else row[0]
                        for row in cursor.fetchall()
                    )
                if after is None:
                    assert "later_job_ready" in plan, plan
                assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan
    page = reads.job_page(JobQuery(namespace="default", stage="enqueued", queue="emails"))
    assert [job.id for job in page.jobs] == emails[:50], "one priority: oldest first"


# -- filters the index cannot serve --------------------------------------------------------
def test_a_type_filter_stops_at_its_scan_limit_and_its_cursor_goes_on(
    later_db: LaterDb, viewer: Client
) -> None:
    # N: a Noop, the type looked for; x: another type. In id order (all priority 0).
    pattern = "NxxxxNNNNxxxxxxNxxN"
    for i, kind in enumerate(pattern):
        later.enqueue(Noop(n=i) if kind == "N" else Order(i))
    order = expected_list(later_db, "enqueued")
    types = dict(later_db.rows("SELECT id, type_name FROM later_job"))
    matches = [job_id for job_id in order if types[job_id] == NOOP]
    assert len(matches) == pattern.count("N")

    query = JobQuery(
        namespace="default", stage="enqueued", type_name=NOOP, page_size=3, scan_limit=5
    )
    found = pages(query)
    assert [j.id for p in found for j in p.jobs] == matches
    assert all(j.type_name == NOOP for p in found for j in p.jobs)
    first = found[0]
    # The first five entries hold one match: the page ends there, said to be cut short,
    # with a cursor past the fifth entry.
    assert [j.id for j in first.jobs] == matches[:1]
    assert first.scanned_out is True
    assert first.after is not None and first.after[-1] == order[4]
    assert [p.scanned_out for p in found].count(True) >= 2
    assert found[-1].after is None

    # Through the JSON, whose scan limit is large: one page, every match.
    page = _json(viewer, f"{BASE}api/jobs?stage=enqueued&type={NOOP}")
    assert [j["id"] for j in page["jobs"]] == matches
    assert page["scanned_out"] is False


def test_a_topic_and_partition_list_its_unfinished_jobs_by_sequence(
    later_db: LaterDb, viewer: Client, settings: Any
) -> None:
    set_later(settings, TOPICS=TOPICS)
    count = TOPICS["ordered"]
    keys = [f"key-{i}" for i in range(200)]
    k1 = keys[0]
    p = partition_for_key(k1, count)
    k2 = next(k for k in keys[1:] if partition_for_key(k, count) == p)
    k3 = next(k for k in keys if partition_for_key(k, count) != p)

    failed_head = later.enqueue_to_partition(Ordered(k1, 0))
    assert later.force_fail_partition_head("ordered", p) == failed_head
    a = later.enqueue_to_partition(Ordered(k2, 0))
    b = later.enqueue_to_partition_delayed(Ordered(k1, 1), HOUR)
    elsewhere = later.enqueue_to_partition(Ordered(k3, 0))
    c = later.enqueue_to_partition(Ordered(k2, 1))
    d = later.enqueue_to_partition(Ordered(k1, 2))
    plain = later.enqueue(Noop())
    sequences = dict(later_db.rows("SELECT id, sequence FROM later_job WHERE topic IS NOT NULL"))
    assert [sequences[j] for j in (a, b, c, d)] == sorted(sequences[j] for j in (a, b, c, d))

    every_stage = JobQuery(
        namespace="default", stage=None, topic="ordered", partition=p, page_size=3
    )
    assert listed(every_stage) == [a, b, c, d]

    def api(query: str) -> list[str]:
        return [j["id"] for j in _json(viewer, f"{BASE}api/jobs?{query}")["jobs"]]

    assert api(f"stage=enqueued&topic=ordered&partition={p}") == [a, c, d]
    assert api(f"stage=delayed&topic=ordered&partition={p}") == [b]
    assert api(f"stage=failed&topic=ordered&partition={p}") == [failed_head]
    other = partition_for_key(k3, count)
    assert api(f"stage=enqueued&topic=ordered&partition={other}") == [elsewhere]
    partitions = dict(later_db.rows("SELECT id, partition FROM later_job WHERE topic IS NOT NULL"))
    assert api("stage=enqueued&topic=ordered") == sorted(
        [a, c, d, elsewhere], key=lambda j: (partitions[j], sequences[j])
    )
    # The plain list holds ready plain jobs only; a topic's jobs are under the topic.
    assert api("stage=enqueued") == [plain]


def test_an_id_prefix_finds_its_jobs_in_every_stage(later_db: LaterDb, viewer: Client) -> None:
    jobs = seed_every_stage(later_db)
    every = sorted(j for ids in jobs.values() for j in ids)
    common = os.path.commonprefix(every)
    assert len(common) < 26
    # One character more than they all share: some of the jobs, not all.
    prefix = every[len(every) // 2][: len(common) + 1]
    expected = [j for j in every if j.startswith(prefix)]
    assert 0 < len(expected) < len(every)

    assert listed(JobQuery(namespace="default", stage=None, id_prefix=prefix, page_size=3)) == (
        expected
    )
    assert listed(JobQuery(namespace="default", stage=None, id_prefix=common, page_size=4)) == (
        every
    )
    found = _json(viewer, f"{BASE}api/jobs?q={prefix.upper()}")
    assert [j["id"] for j in found["jobs"]] == expected
    failed = _json(viewer, f"{BASE}api/jobs?q={common}&stage=failed")
    assert [j["id"] for j in failed["jobs"]] == sorted(jobs["failed"])
    one = jobs["waiting"][1]
    near = [j for j in every if j.startswith(one[:25])]
    assert [j["id"] for j in _json(viewer, f"{BASE}api/jobs?q={one[:25]}")["jobs"]] == near

    whole = viewer.get(f"{BASE}jobs/?q={one.upper()}")
    assert whole.status_code == 302 and whole["Location"] == f"{BASE}jobs/{one}/"
    assert viewer.get(whole["Location"]).status_code == 200


def test_an_id_prefix_search_works_under_a_linguistic_collation(later_db: LaterDb) -> None:
    if later_db.vendor != "postgresql":
        pytest.skip("SQLite compares text bytewise")
    ids = sorted(later.enqueue_many(Noop(n=i) for i in range(5)))
    prefix = ids[0][:12]
    expected = [j for j in ids if j.startswith(prefix)]
    connection = connections[later_db.alias]
    with transaction.atomic(using=later_db.alias), connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'later_job'::regclass AND attname = 'id'"
        )
        [column_type] = cursor.fetchone()
        # A database created with a linguistic default collation, for this block only.
        cursor.execute(
            f'ALTER TABLE later_job ALTER COLUMN id TYPE {column_type} COLLATE "und-x-icu"'
        )
        try:
            found = listed(JobQuery(namespace="default", stage=None, id_prefix=prefix))
        finally:
            transaction.set_rollback(True, using=later_db.alias)
    assert found == expected


# -- refused filters ----------------------------------------------------------------------
def test_bad_filters_and_cursors_are_refused_with_a_message(
    later_db: LaterDb, viewer: Client
) -> None:
    later.enqueue(Noop())
    refused = {
        "stage=bogus": "unknown stage 'bogus'",
        "stage=enqueued&after=zz": "the cursor 'after' is malformed",
        "stage=enqueued&after=i1.x": "the cursor 'after' is malformed",
        "stage=enqueued&after=i1.s01-2": "the cursor 'after' is malformed",
        "stage=enqueued&after=" + "i1." * 100 + "i1": "the cursor 'after' is empty or too long",
        "stage=enqueued&partition=1": "a partition filter needs a topic",
        "stage=enqueued&topic=ordered&partition=x": "partition must be a number",
        "q=01u": "is not the start of a job id",
        "q=" + "0" * 27: "is not the start of a job id",
    }
    for query, message in refused.items():
        api = viewer.get(f"{BASE}api/jobs?{query}")
        assert api.status_code == 400, query
        assert message in json.loads(api.content)["error"], query
        page = viewer.get(f"{BASE}jobs/?{query}")
        assert page.status_code == 400, query
        assert message in html.unescape(page.content.decode()), query
    assert viewer.get(f"{BASE}api/jobs?stage=enqueued&after=").status_code == 200


def test_a_cursor_that_does_not_fit_the_list_is_refused(later_db: LaterDb, viewer: Client) -> None:
    job_id = later.enqueue(Noop())
    statuses = {}
    for query in (
        "stage=enqueued&after=i5",  # one value; the list's key has two
        f"q=0&after=i0.s{job_id}",  # two values; the id search's key has one
        "stage=enqueued&after=sabc.sdef",  # a string where the priority is
        "stage=enqueued&after=i99999999999999999999.sabc",
    ):
        statuses[query] = (
            viewer.get(f"{BASE}api/jobs?{query}").status_code,
            viewer.get(f"{BASE}jobs/?{query}").status_code,
        )
    assert statuses == dict.fromkeys(statuses, (400, 400))


# -- the job page -----------------------------------------------------------------------
def test_the_job_page_shows_durations_history_parent_and_continuations(
    later_db: LaterDb, viewer: Client
) -> None:
    done = later.enqueue(Noop(n=1))
    drain()
    assert later_db.stage_of(done) == "success"
    # A history with a retry in it: running 3000-3500 and 6000-6400, 900 ms of 5400.
    history = "enqueued@1000;running@3000;requeued@3500;enqueued@5000;running@6000;success@6400;"
    _set(later_db, done, created_ms=1000, finished_ms=6400, history=history)
    parent = later.enqueue_delayed(Noop(n=2), HOUR)
    children = [later.enqueue_continue(parent, Noop(n=100 + i)) for i in range(30)]

    job = _json(viewer, f"{BASE}api/jobs/{done}")
    assert job["durations_ms"] == {"total": 5400, "processing": 900, "failed": 0, "waiting": 4500}
    assert job["history"] == [
        {"stage": stage, "at_ms": at}
        for stage, at in (
            ("enqueued", 1000), ("running", 3000), ("requeued", 3500),
            ("enqueued", 5000), ("running", 6000), ("success", 6400),
        )
    ]  # fmt: skip
    assert "payload" not in job
    page = html.unescape(viewer.get(f"{BASE}jobs/{done}/").content.decode())
    assert re.search(r'data-duration="total">5\.4 s<', page)
    assert re.search(r'data-duration="processing">900 ms<', page)
    assert re.search(r'data-duration="waiting">4\.5 s<', page)
    assert len(re.findall(r'<li class="later-stage-', page)) == 6
    assert "None." in page, "no continuation"

    job = _json(viewer, f"{BASE}api/jobs/{parent}")
    assert job["parent_id"] is None
    assert [c["id"] for c in job["children"]] == sorted(children)[:25]
    assert job["more_children"] is True
    assert {c["stage"] for c in job["children"]} == {"waiting"}
    page = html.unescape(viewer.get(f"{BASE}jobs/{parent}/").content.decode())
    shown = re.findall(r'<tr data-job-id="([0-9a-z]{26})">', page)
    assert shown == sorted(children)[:25]
    assert "The first 25 are shown." in page

    child = children[7]
    child_job = _json(viewer, f"{BASE}api/jobs/{child}")
    assert child_job["parent_id"] == parent
    assert child_job["children"] == [] and child_job["more_children"] is False
    assert [h["stage"] for h in child_job["history"]] == history_stages(
        str(later_db.job_field(child, "history"))
    )
    durations = child_job["durations_ms"]
    assert durations["total"] == durations["processing"] + durations["waiting"]
    assert durations["failed"] == 0
    assert durations["processing"] == 0, "it has not run"
    assert durations["total"] == child_job["now_ms"] - child_job["created_ms"]
    child_page = viewer.get(f"{BASE}jobs/{child}/").content.decode()
    assert f'<a id="later-parent" href="{BASE}jobs/{parent}/"' in child_page

    assert viewer.get(f"{BASE}api/jobs/{'0' * 26}").status_code == 404
    assert viewer.get(f"{BASE}jobs/{'0' * 26}/").status_code == 404


def test_the_job_page_shows_a_unique_jobs_key_and_window(later_db: LaterDb, viewer: Client) -> None:
    keyed = later.enqueue(Refresh(account=3))
    windowed = later.enqueue(Digest(n=1))
    plain = later.enqueue(Noop(n=1))
    assert _json(viewer, f"{BASE}api/jobs/{keyed}")["unique_key"] == "account-3"
    page = html.unescape(viewer.get(f"{BASE}jobs/{keyed}/").content.decode())
    assert re.search(r'id="later-unique-key">account-3 \(one unfinished job\)<', page)
    page = html.unescape(viewer.get(f"{BASE}jobs/{windowed}/").content.decode())
    assert re.search(r'id="later-unique-key">digest \(one job in the window from <time', page)
    assert "later-unique-key" not in viewer.get(f"{BASE}jobs/{plain}/").content.decode()


def test_a_running_job_counts_its_time_so_far(later_db: LaterDb, viewer: Client) -> None:
    job_id = later.enqueue(Noop())
    assert _claim(later_db, 1) == [job_id]
    now = later_db.now_ms()
    _set(
        later_db,
        job_id,
        created_ms=now - 10_000,
        history=f"enqueued@{now - 10_000};running@{now - 4_000};",
    )
    job = _json(viewer, f"{BASE}api/jobs/{job_id}")
    durations = job["durations_ms"]
    assert job["finished_ms"] is None and job["stage"] == "running"
    assert durations["total"] == job["now_ms"] - (now - 10_000)
    assert durations["processing"] == job["now_ms"] - (now - 4_000)
    assert durations["waiting"] == 6_000


@pytest.mark.parametrize(
    ("history", "finished_ms", "expected"),
    [
        # Failed for good: its failure ends it, and nothing sat failed.
        ("enqueued@1000;running@3000;failed@3500;", 3500, (2500, 500, 0, 2000)),
        # Retried by an operator 6 s after it failed, then succeeded: those
        # 6 s are not waiting; the wait is 2 s before it ran, 0.3 s after the retry.
        (
            "enqueued@1000;running@3000;failed@3500;enqueued@9500;running@9800;success@10000;",
            10_000,
            (9000, 700, 6000, 2300),
        ),
        # Retried and not run yet (now is 10500): it has waited 1 s since the retry.
        ("enqueued@1000;running@3000;failed@3500;enqueued@9500;", None, (9500, 500, 6000, 3000)),
        # Failed twice, retried twice: each time failed is left out.
        (
            "enqueued@0;running@100;failed@200;enqueued@1200;running@1300;failed@1400;"
            "enqueued@4400;running@4500;success@4600;",
            4600,
            (4600, 300, 4000, 300),
        ),
        # A continuation failed with its parent, revived by the parent's retry.
        (
            "waiting@1000;failed@2000;waiting@5000;enqueued@6000;running@6500;success@7000;",
            7000,
            (6000, 500, 3000, 2500),
        ),
        # A retry by the job's own policy (requeued) is waiting, not failure.
        (
            "enqueued@1000;running@3000;requeued@3500;enqueued@5000;running@6000;success@6400;",
            6400,
            (5400, 900, 0, 4500),
        ),
    ],
)
def test_durations_leave_out_the_time_a_job_sat_failed_before_a_retry(
    history: str, finished_ms: int | None, expected: tuple[int, int, int, int]
) -> None:
    changes = reads.parse_history(history)
    found = reads.durations(changes, changes[0][1], finished_ms, now_ms=10_500)
    assert found == dict(zip(("total", "processing", "failed", "waiting"), expected, strict=True))
    assert found["total"] == found["processing"] + found["failed"] + found["waiting"]


# -- times and their zone ---------------------------------------------------------------
WINTER_MS = 1_768_478_400_250  # 2026-01-15 12:00:00.250 UTC
SUMMER_MS = 1_784_116_800_000  # 2026-07-15 12:00:00.000 UTC


def test_times_are_shown_in_the_admin_time_zone_and_name_it(
    later_db: LaterDb, viewer: Client, settings: Any
) -> None:
    """Pages show every time in the admin's time zone (TIME_ZONE, or the zone
    activated for the request) followed by that zone's abbreviation at that
    time: the zone is never left for the reader to guess."""
    job_id = later.enqueue_delayed(Noop(), HOUR)
    _set(later_db, job_id, created_ms=WINTER_MS, run_at_ms=SUMMER_MS)

    def shown(url: str) -> list[str]:
        content = viewer.get(url).content.decode()
        return re.findall(r'<time data-ms="\d+"(?: title="[^"]*")?>([^<]*)</time>', content)

    job_page, list_page = f"{BASE}jobs/{job_id}/", f"{BASE}jobs/?stage=delayed"
    assert shown(job_page)[:2] == ["2026-01-15 12:00:00.250 UTC", "2026-07-15 12:00:00.000 UTC"]
    # The list, to the second (the whole time is the title).
    assert shown(list_page)[:2] == ["2026-01-15 12:00:00 UTC", "2026-07-15 12:00:00 UTC"]
    settings.TIME_ZONE = "Europe/Paris"
    assert shown(job_page)[:2] == ["2026-01-15 13:00:00.250 CET", "2026-07-15 14:00:00.000 CEST"]
    assert shown(list_page)[:2] == ["2026-01-15 13:00:00 CET", "2026-07-15 14:00:00 CEST"]
    assert 'title="2026-01-15 13:00:00.250 CET"' in viewer.get(list_page).content.decode()
    with timezone.override("America/New_York"):
        assert shown(job_page)[:2] == [
            "2026-01-15 07:00:00.250 EST",
            "2026-07-15 08:00:00.000 EDT",
        ]
    every = shown(job_page)
    assert every and all(re.fullmatch(r"[\d-]{10} [\d:]{8}\.\d{3} CES?T", t) for t in every)
