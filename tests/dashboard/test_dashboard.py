"""The dashboard's pages, JSON and actions through Django's test client, on
SQLite and PostgreSQL: permissions, counts against the truth, lists and
their cursors, the actions, and that no response carries payload bytes."""

from __future__ import annotations

import json
import random
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.core.management import call_command
from django.db import connections, transaction
from django.test import Client

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import Heartbeat, PartitionClaimRequest
from later_django.testing import drain
from later_django.types import PartitionLane
from tests.helpers import LaterDb, set_later
from tests.jobapp.jobs import Gate, Noop, NoRetry, Order, Ordered

BASE = "/admin/later/"
HOUR = timedelta(hours=1)
SECRET = "s3cr3t-payload-bytes"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


def _user(name: str, *perms: str, staff: bool = True) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    return user


def _client(user: User | None, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def operator(later_db: LaterDb) -> Client:
    return _client(_user("operator", "later_django.view_dashboard", "later_django.change_job"))


def _json(client: Client, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return json.loads(response.content)


def test_the_admin_index_links_to_the_dashboard(operator: Client) -> None:
    index = operator.get("/admin/")
    assert index.status_code == 200
    assert b"/admin/later_django/dashboard/" in index.content
    moved = operator.get("/admin/later_django/dashboard/")
    assert moved.status_code == 302 and moved["Location"] == BASE


def test_pages_need_staff_then_the_view_permission(later_db: LaterDb) -> None:
    logged_out = _client(None).get(BASE)
    assert logged_out.status_code == 302 and "/admin/login/" in logged_out["Location"]
    staff_only = _client(_user("staff"))
    for url in (BASE, f"{BASE}jobs/", f"{BASE}topics/", f"{BASE}recurring/", f"{BASE}api/overview"):
        assert staff_only.get(url).status_code == 403, url
    viewer = _client(_user("viewer", "later_django.view_dashboard"))
    for url in (BASE, f"{BASE}jobs/", f"{BASE}topics/", f"{BASE}recurring/", f"{BASE}api/overview"):
        assert viewer.get(url).status_code == 200, url


def test_actions_need_the_change_permission_and_csrf(later_db: LaterDb) -> None:
    job_id = later.enqueue(Noop())
    viewer = _client(_user("viewer", "later_django.view_dashboard"))
    refused = viewer.post(f"{BASE}actions/", {"action": "cancel", "job": job_id})
    assert refused.status_code == 403
    operator = _client(
        _user("op", "later_django.view_dashboard", "later_django.change_job"), csrf=True
    )
    no_token = operator.post(f"{BASE}actions/", {"action": "cancel", "job": job_id})
    assert no_token.status_code == 403
    assert later_db.stage_of(job_id) == "enqueued"
    page = operator.get(f"{BASE}jobs/?stage=enqueued")
    token = page.cookies["csrftoken"].value
    done = operator.post(
        f"{BASE}actions/", {"action": "cancel", "job": job_id, "csrfmiddlewaretoken": token}
    )
    assert done.status_code == 302
    assert later_db.stage_of(job_id) == "cancelled"


def test_counts_equal_the_truth_after_a_random_workload(
    later_db: LaterDb, operator: Client, tmp_path: Any
) -> None:
    rng = random.Random(7)
    ids = []
    for _ in range(120):
        kind = rng.random()
        if kind < 0.4:
            ids.append(later.enqueue(Noop()))
        elif kind < 0.6:
            ids.append(later.enqueue_delayed(Noop(), HOUR))
        elif kind < 0.8:
            ids.append(later.enqueue(Gate(str(tmp_path / "closed"))))
        else:
            parent = rng.choice(ids) if ids else later.enqueue(Noop())
            ids.append(later.enqueue_continue(parent, Noop()))
    for job_id in rng.sample(ids, 20):
        later.cancel(job_id)
    drain()
    truth = dict(later_db.rows("SELECT stage, COUNT(*) FROM later_job GROUP BY stage"))
    counts = _json(operator, f"{BASE}api/overview")["counts"]
    assert {k: v for k, v in counts.items() if v} == truth


def test_no_response_carries_payload_bytes(
    later_db: LaterDb, operator: Client, tmp_path: Any
) -> None:
    failed = later.enqueue(NoRetry())
    later.enqueue(Order(1, note=SECRET))
    later.enqueue_delayed(Order(2, note=SECRET), HOUR)
    drain()
    urls = [
        BASE,
        f"{BASE}topics/",
        f"{BASE}recurring/",
        f"{BASE}api/overview",
        f"{BASE}api/samples",
    ]
    for stage in ("enqueued", "delayed", "failed", "success"):
        urls += [f"{BASE}jobs/?stage={stage}", f"{BASE}api/jobs?stage={stage}"]
    for row in later_db.rows("SELECT id FROM later_job"):
        urls += [f"{BASE}jobs/{row[0]}/", f"{BASE}api/jobs/{row[0]}"]
    for url in urls:
        response = operator.get(url)
        assert response.status_code == 200, url
        assert SECRET.encode() not in response.content, url
    assert b"refused once and for all" in operator.get(f"{BASE}jobs/{failed}/").content


def test_the_list_pages_through_every_job_once(later_db: LaterDb, operator: Client) -> None:
    ids = {later.enqueue(Noop(), priority=random.Random(3).choice([0, 5])) for _ in range(7)}
    ids |= {later.enqueue(Noop(), priority=5) for _ in range(6)}
    seen: list[str] = []
    url = f"{BASE}api/jobs?stage=enqueued"
    while True:
        page = _json(operator, url)
        seen += [j["id"] for j in page["jobs"]]
        if page["next"] is None:
            break
        url = f"{BASE}api/jobs?stage=enqueued&after={page['next']}"
        assert len(page["jobs"]) == 50 or page["next"] is None
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))


def test_the_topics_page_lists_every_partition_of_a_registered_topic(
    later_db: LaterDb, operator: Client, settings: Any
) -> None:
    """A topic of 8 partitions, jobs in 2 of them: the page and its JSON list
    all 8, the empty ones with depth 0 and no head; so does a topic
    configured but not registered in the database yet."""
    set_later(settings, TOPICS={"ordered": 8})
    call_command("later_migrate", verbosity=0)
    set_later(settings, TOPICS={"ordered": 8, "fresh": 3})
    first = later.partition_for_key("k", 8)
    second = next(
        key for key in (f"key-{n}" for n in range(100))
        if later.partition_for_key(key, 8) != first
    )  # fmt: skip
    for n in range(3):
        later.enqueue_to_partition(Ordered("k", n))
    later.enqueue_to_partition(Ordered(second, 0))
    page = operator.get(f"{BASE}topics/")
    assert page.status_code == 200
    for name, count in (("ordered", 8), ("fresh", 3)):
        section = page.content.decode().split(f'data-topic="{name}"', 1)[1].split("</section>")[0]
        assert f"{count} partitions" in section
        assert re.findall(r'data-partition="(\d+)"', section) == [str(p) for p in range(count)]
    [topic] = [t for t in _json(operator, f"{BASE}api/topics")["topics"] if t["name"] == "ordered"]
    assert (topic["partitions"], topic["depth"]) == (8, 4)
    parts = topic["partition_stats"]
    assert [p["partition"] for p in parts] == list(range(8))
    empty = [p for p in parts if p["depth"] == 0]
    assert len(empty) == 6
    assert all(p["head_sequence"] is None and p["head_stage"] is None for p in empty)
    assert all(p["head_age_ms"] is None and p["owner"] is None for p in empty)


# A server id as later_worker makes them (host-pid-suffix), with a long host name.
SERVER_ID = "worker-7.eu-west-3.compute.internal-48213-a1b2c3"


def live_server_owning(later_db: LaterDb, server_id: str, topic: str, partition: int) -> None:
    """Record ``server_id`` as a live server holding ``topic``'s ``partition``."""
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as cursor:
        dialect.cluster.server_heartbeat(
            cursor,
            Heartbeat(
                server_id=server_id, namespace="default", hostname="worker-7", pid=48213,
                workers=4, topics=True,
            ),
        )  # fmt: skip
        claim = dialect.partitions.partition_claim(
            cursor,
            PartitionClaimRequest(
                lane=PartitionLane("default", topic, partition),
                owner=server_id,
                partition_lease_ms=60_000,
                job_lease_ms=60_000,
                server_ttl_ms=60_000,
            ),
        )
    assert claim is not None


def test_servers_and_partition_owners_show_their_full_ids(
    later_db: LaterDb, operator: Client, settings: Any
) -> None:
    """The overview's servers and the topics page's partition owners and
    consumer-group members are shown by their whole id, never a tail of it."""
    set_later(settings, TOPICS={"ordered": 2})
    call_command("later_migrate", verbosity=0)
    live_server_owning(later_db, SERVER_ID, "ordered", 1)

    overview = operator.get(BASE).content.decode()
    cells = re.findall(r'<td class="later-server-id">([^<]*)</td>', overview)
    assert cells == [SERVER_ID]
    topics = operator.get(f"{BASE}topics/").content.decode()
    row = topics.split('data-partition="1"', 1)[1].split("</tr>")[0]
    assert f'<td class="later-server-id">{SERVER_ID}</td>' in row
    assert [s["id"] for s in _json(operator, f"{BASE}api/overview")["servers"]] == [SERVER_ID]
