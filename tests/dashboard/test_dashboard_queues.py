"""The dashboard's Queues tab through Django's test client, on SQLite and
PostgreSQL: each queue's counts against the jobs, the live servers serving
it and the warning when none serves its ready jobs, pause and resume by
POST (a stale pause changes nothing), and the requests it refuses."""

from __future__ import annotations

import html
import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db import connections, transaction
from django.test import Client

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, Heartbeat
from later_django.queues import pause_queue, paused_queues, resume_queue
from tests.helpers import LaterDb, set_later
from tests.jobapp.jobs import Noop, Ordered

BASE = "/admin/later/"
QUEUES_PAGE = f"{BASE}queues/"
QUEUES_API = f"{BASE}api/queues"
QUEUE_ACTION = f"{BASE}queues/actions/"
QUEUES = {"default": {}, "emails": {}}
PREVIOUS_RELEASE = "previous release: ignores pause"
STRANDED = "no live server serves this queue"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


def _client(name: str, *codenames: str, csrf: bool = False) -> Client:
    user = User.objects.create(username=name, is_staff=True)  # no password to hash
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="later_django", codename=codename)
        )
    client = Client(enforce_csrf_checks=csrf, raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def queued(later_db: LaterDb, settings: Any) -> LaterDb:
    """``later_db`` with the queues "default" and "emails" declared."""
    set_later(settings, QUEUES=QUEUES)
    return later_db


@pytest.fixture
def operator(queued: LaterDb) -> Client:
    """Staff allowed to view the dashboard and to act on jobs and queues."""
    return _client("operator", "view_dashboard", "change_job")


@pytest.fixture
def viewer(queued: LaterDb) -> Client:
    """Staff allowed to view the dashboard, not to act."""
    return _client("viewer", "view_dashboard")


def _queues(client: Client) -> dict[str, dict[str, Any]]:
    response = client.get(QUEUES_API)
    assert response.status_code == 200, response.content[:500]
    return {q["name"]: q for q in json.loads(response.content)["queues"]}


def _row(client: Client, name: str) -> str:
    """The queue's row of the Queues page, as HTML."""
    page = client.get(QUEUES_PAGE)
    assert page.status_code == 200, page.content[:500]
    text = page.content.decode()
    assert text.count(f'data-queue="{name}"') == 1, name
    return text.split(f'data-queue="{name}"', 1)[1].split("</tr>", 1)[0]


def _act(client: Client, action: str, queue: str) -> str:
    """POST ``action`` on ``queue``, follow the redirect to the Queues page;
    return the one message it shows."""
    response = client.post(QUEUE_ACTION, {"action": action, "queue": queue}, follow=True)
    assert response.status_code == 200, response.content[:500]
    assert response.redirect_chain == [(QUEUES_PAGE, 302)]
    shown = [str(m) for m in response.context["messages"]]
    assert len(shown) == 1, shown
    assert shown[0] in html.unescape(response.content.decode())
    return shown[0]


def live_server_serving(later_db: LaterDb, server_id: str, queues: str | None) -> None:
    """Record ``server_id`` as a live server serving ``queues`` (None: a
    server of a release before queues, which writes no queues)."""
    if queues is None:
        now = later_db.now_ms()
        later_db.execute(
            "INSERT INTO later_server (id, namespace, hostname, pid, workers, topics, "
            "started_ms, heartbeat_ms) VALUES (%s, 'default', 'old-host', 7, 4, %s, %s, %s)",
            [server_id, False, now, now],
        )
        return
    with (
        transaction.atomic(using=later_db.alias),
        connections[later_db.alias].cursor() as cursor,
    ):
        dialect_for(later_db.alias).cluster.server_heartbeat(
            cursor,
            Heartbeat(
                server_id=server_id, namespace="default", hostname="host", pid=1, workers=4,
                queues=queues,
            ),
        )  # fmt: skip


def _claim(later_db: LaterDb, queue: str | None, limit: int) -> list[str]:
    """Claim up to ``limit`` ready jobs of ``queue`` (its stored value) as a
    worker serving it does."""
    with (
        transaction.atomic(using=later_db.alias),
        connections[later_db.alias].cursor() as cursor,
    ):
        claimed = dialect_for(later_db.alias).hot.claim(
            cursor,
            ClaimRequest(
                namespace="default", owner="test-owner", limit=limit, lease_ms=60_000, queue=queue
            ),
        )
    return [job.id for job in claimed]


def _fail(later_db: LaterDb, job_id: str) -> None:
    changed = later_db.execute(
        "UPDATE later_job SET stage = 'failed', finished_ms = %s, expires_ms = %s, "
        "last_error = 'boom' WHERE id = %s",
        [later_db.now_ms(), later_db.now_ms() + 3_600_000, job_id],
    )
    assert changed == 1


def _truth(later_db: LaterDb) -> dict[str, dict[str, int]]:
    """Plain jobs per queue and stage, counted in later_job."""
    found: dict[str, dict[str, int]] = {}
    for queue, stage, n in later_db.rows(
        "SELECT queue, stage, COUNT(*) FROM later_job WHERE topic IS NULL GROUP BY queue, stage"
    ):
        found.setdefault(str(queue or "default"), {})[str(stage)] = int(n)
    return found


# -- counts ---------------------------------------------------------------------------
def test_queues_count_each_queues_jobs_as_the_jobs_are(
    queued: LaterDb, operator: Client, settings: Any
) -> None:
    """Every declared queue is listed, "default" first, with its ready,
    delayed, running and failed jobs as later_job holds them; a topic's
    jobs are in no queue; a queue not declared here that has jobs or a
    pause is listed after them, without buttons."""
    set_later(settings, QUEUES={**QUEUES, "reports": {}, "legacy": {}}, TOPICS={"ordered": 2})
    later.enqueue_many(Noop(n=i) for i in range(3))
    emails = [later.enqueue(Noop(n=i), queue="emails") for i in range(6)]
    later.enqueue(Noop(n=9), delay=timedelta(hours=1), queue="emails")
    later.enqueue(Noop(n=1), queue="reports")
    later.enqueue_to_partition(Ordered(key="k", n=0))
    assert pause_queue("legacy")
    running = _claim(queued, "emails", 2)
    assert set(running) <= set(emails) and len(running) == 2
    _fail(queued, emails[-1])
    set_later(settings, QUEUES=QUEUES)  # reports and legacy are no longer declared

    shown = _queues(operator)
    assert list(shown) == ["default", "emails", "legacy", "reports"]
    truth = _truth(queued)
    assert set(truth) == {"default", "emails", "reports"}
    for name, queue in shown.items():
        stages = truth.get(name, {})
        assert {k: v for k, v in queue["counts"].items() if v} == stages, name
        assert queue["ready"] == stages.get("enqueued", 0), name
        assert queue["running"] == stages.get("running", 0), name
        assert queue["failed"] == stages.get("failed", 0), name
        assert queue["delayed"] == stages.get("delayed", 0) + stages.get("requeued", 0), name
    assert (shown["emails"]["ready"], shown["emails"]["running"]) == (3, 2)
    assert (shown["emails"]["delayed"], shown["emails"]["failed"]) == (1, 1)
    assert [q["declared"] for q in shown.values()] == [True, True, False, False]
    assert [q["paused"] for q in shown.values()] == [False, False, True, False]

    row = _row(operator, "emails")
    for field, n in (("ready", 3), ("delayed", 1), ("running", 2), ("failed", 1)):
        assert f'<td data-count="{field}">{n}</td>' in row, field
    assert 'value="pause"' in row
    for undeclared in ("legacy", "reports"):
        row = _row(operator, undeclared)
        assert "not declared here" in row and 'name="action"' not in row
    assert 'data-state="paused"' in _row(operator, "legacy")


def test_the_overview_splits_partition_jobs_from_named_queues(
    queued: LaterDb, operator: Client, settings: Any
) -> None:
    """The overview's ``partition_counts`` counts a topic's jobs only: not
    the jobs of a named queue, which are plain jobs too."""
    set_later(settings, TOPICS={"ordered": 2})
    later.enqueue(Noop(), queue="emails")
    later.enqueue(Noop())
    later.enqueue_to_partition(Ordered(key="k", n=0))
    overview = json.loads(operator.get(f"{BASE}api/overview").content)
    assert overview["counts"]["enqueued"] == 3
    assert overview["partition_counts"]["enqueued"] == 1


# -- servers and the warning -------------------------------------------------------------
def test_a_queue_with_ready_jobs_and_no_live_server_is_flagged_until_one_serves_it(
    queued: LaterDb, operator: Client
) -> None:
    """A queue with ready jobs that no live server serves is flagged, on its
    row of the page and in the JSON; a queue without ready jobs is not. A
    server serving the queue ends the flag, and so does a server of a
    release before queues (it claims from every queue), marked as one that
    ignores pause; so does the queue running dry."""
    later.enqueue(Noop(), queue="emails")
    live_server_serving(queued, "web-1-a", "default")
    shown = _queues(operator)
    assert [(q["name"], q["stranded"]) for q in shown.values()] == [
        ("default", False),
        ("emails", True),
    ]
    assert [s["id"] for s in shown["default"]["servers"]] == ["web-1-a"]
    assert shown["emails"]["servers"] == []
    assert STRANDED in _row(operator, "emails")
    assert 'class="later-stranded"' in operator.get(QUEUES_PAGE).content.decode()
    assert STRANDED not in _row(operator, "default")

    live_server_serving(queued, "web-2-b", "emails,default")
    shown = _queues(operator)
    assert not shown["emails"]["stranded"]
    assert [s["id"] for s in shown["emails"]["servers"]] == ["web-2-b"]
    assert [s["id"] for s in shown["default"]["servers"]] == ["web-1-a", "web-2-b"]
    assert STRANDED not in operator.get(QUEUES_PAGE).content.decode()

    queued.execute("DELETE FROM later_server WHERE id = 'web-2-b'")
    assert _queues(operator)["emails"]["stranded"]
    live_server_serving(queued, "old-7-c", None)
    shown = _queues(operator)
    assert not shown["emails"]["stranded"]
    assert shown["emails"]["servers"] == [
        {"id": "old-7-c", "hostname": "old-host", "pid": 7, "previous_release": True}
    ]
    row = _row(operator, "emails")
    assert "old-7-c" in row and PREVIOUS_RELEASE in row and STRANDED not in row
    assert PREVIOUS_RELEASE not in row.split("old-7-c")[0]  # web-1-a is not marked
    servers = json.loads(operator.get(f"{BASE}api/overview").content)["servers"]
    assert {s["id"]: s["queues"] for s in servers} == {"old-7-c": None, "web-1-a": ["default"]}

    queued.execute("DELETE FROM later_server WHERE id = 'old-7-c'")
    assert _queues(operator)["emails"]["stranded"]
    _claim(queued, "emails", 1)  # a server that served it, gone since
    assert not _queues(operator)["emails"]["stranded"], "no ready job left"


def test_a_silent_server_serves_no_queue(queued: LaterDb, operator: Client) -> None:
    """A server whose heartbeat is older than 15 s is no longer live."""
    later.enqueue(Noop(), queue="emails")
    live_server_serving(queued, "web-2-b", "emails")
    assert not _queues(operator)["emails"]["stranded"]
    queued.execute("UPDATE later_server SET heartbeat_ms = heartbeat_ms - 16000")
    shown = _queues(operator)
    assert shown["emails"]["stranded"] and shown["emails"]["servers"] == []


# -- pause and resume -----------------------------------------------------------------
def test_pause_and_resume_by_post_change_the_queues_state(
    queued: LaterDb, operator: Client
) -> None:
    """Pause stops every server from starting the queue's jobs; the row then
    shows it paused with a Resume button; Resume undoes it."""
    later.enqueue(Noop(), queue="emails")
    message = _act(operator, "pause", "emails")
    assert message == (
        "Queue emails paused: no server starts its jobs until it is resumed "
        "(jobs running now finish)."
    )
    assert paused_queues() == {"emails"}
    assert _claim(queued, "emails", 1) == [], "a paused queue's jobs do not start"
    row = _row(operator, "emails")
    assert 'data-state="paused"' in row and 'value="resume"' in row and 'value="pause"' not in row
    assert _queues(operator)["emails"]["paused_since_ms"] is not None
    assert 'value="pause"' in _row(operator, "default"), "only the queue named is paused"

    message = _act(operator, "resume", "emails")
    assert message == "Queue emails resumed: servers serving it start its jobs again."
    assert paused_queues() == set()
    row = _row(operator, "emails")
    assert 'data-state="running"' in row and 'value="pause"' in row
    assert _queues(operator)["emails"]["paused_since_ms"] is None
    assert len(_claim(queued, "emails", 1)) == 1


def test_pausing_a_paused_queue_from_a_stale_page_changes_nothing(
    queued: LaterDb, operator: Client
) -> None:
    """A page older than the last pause (another operator's, or
    pause_queue()) offers Pause: pressing it says the queue was already
    paused and leaves it as it is; Resume on a running queue likewise."""
    assert pause_queue("emails")
    paused_at = queued.scalar("SELECT changed_ms FROM later_queue WHERE name = 'emails'")
    assert _act(operator, "pause", "emails") == "Queue emails was already paused: nothing changed."
    assert paused_queues() == {"emails"}
    assert queued.scalar("SELECT changed_ms FROM later_queue WHERE name = 'emails'") == paused_at

    assert resume_queue("emails")
    assert _act(operator, "resume", "emails") == "Queue emails was not paused: nothing changed."
    assert _act(operator, "resume", "default") == "Queue default was not paused: nothing changed."
    assert paused_queues() == set()


def test_a_pause_names_the_servers_that_ignore_it(queued: LaterDb, operator: Client) -> None:
    """A live server of a release before queues claims from every queue and
    ignores pause: the message of a pause says so."""
    live_server_serving(queued, "old-7-c", None)
    assert _act(operator, "pause", "default").endswith(
        " 1 live server of a release before queues ignore the pause and still start its jobs."
    )
    assert paused_queues() == {"default"}


def test_the_pause_returns_to_the_page_it_came_from(queued: LaterDb, operator: Client) -> None:
    response = operator.post(
        QUEUE_ACTION, {"action": "pause", "queue": "emails", "next": f"{BASE}?x=1"}
    )
    assert response.status_code == 302 and response["Location"] == f"{BASE}?x=1"
    elsewhere = operator.post(
        QUEUE_ACTION, {"action": "resume", "queue": "emails", "next": "https://evil.example/"}
    )
    assert elsewhere.status_code == 302 and elsewhere["Location"] == QUEUES_PAGE


# -- refusals -----------------------------------------------------------------------------
def test_a_viewer_sees_no_buttons_and_may_not_pause(queued: LaterDb, viewer: Client) -> None:
    """View permission alone shows the queues without Pause or Resume, and
    a POST of either is refused with 403, changing nothing."""
    assert pause_queue("emails")
    page = viewer.get(QUEUES_PAGE)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-queue="emails"' in text and 'data-state="paused"' in text
    assert "later-queue-action" not in text and 'name="action"' not in text
    for action, queue in (("resume", "emails"), ("pause", "default")):
        refused = viewer.post(QUEUE_ACTION, {"action": action, "queue": queue})
        assert refused.status_code == 403, (action, queue)
    assert paused_queues() == {"emails"}


def test_the_queues_need_the_view_permission(queued: LaterDb) -> None:
    staff = _client("staff")
    for url in (QUEUES_PAGE, QUEUES_API):
        assert staff.get(url).status_code == 403, url
    assert staff.post(QUEUE_ACTION, {"action": "pause", "queue": "emails"}).status_code == 403
    logged_out = Client().get(QUEUES_PAGE)
    assert logged_out.status_code == 302 and "/admin/login/" in logged_out["Location"]
    assert paused_queues() == set()


def test_a_pause_needs_csrf_and_a_post(queued: LaterDb) -> None:
    client = _client("op", "view_dashboard", "change_job", csrf=True)
    no_token = client.post(QUEUE_ACTION, {"action": "pause", "queue": "emails"})
    assert no_token.status_code == 403
    assert client.get(QUEUE_ACTION).status_code == 405
    assert paused_queues() == set()
    token = client.get(QUEUES_PAGE).cookies["csrftoken"].value
    done = client.post(
        QUEUE_ACTION, {"action": "pause", "queue": "emails", "csrfmiddlewaretoken": token}
    )
    assert done.status_code == 302
    assert paused_queues() == {"emails"}


def test_an_unknown_action_or_queue_is_refused_with_a_message(
    queued: LaterDb, operator: Client
) -> None:
    refusals = {
        ("stop", "emails"): "unknown action 'stop': use one of pause, resume",
        ("pause", "reports"): "name='reports' is not declared in LATER['QUEUES']",
        ("pause", ""): "name='' is not a queue name",
        ("resume", "no such"): "name='no such' is not a queue name",
    }
    for (action, queue), message in refusals.items():
        response = operator.post(QUEUE_ACTION, {"action": action, "queue": queue})
        assert response.status_code == 400, (action, queue)
        assert message in html.unescape(response.content.decode()), response.content
    assert paused_queues() == set()


def test_a_queue_links_to_its_ready_jobs_in_the_order_its_workers_take_them(
    viewer: Client,
) -> None:
    plain = later.enqueue(Noop(n=1))
    low = later.enqueue(Noop(n=2), queue="emails")
    high = later.enqueue(Noop(n=3), queue="emails", priority=9)
    link = "?stage=enqueued&amp;queue=emails"
    assert link in _row(viewer, "emails")
    page = viewer.get(f"{BASE}jobs/" + html.unescape(link)).content.decode()
    assert page.index(high) < page.index(low), "by priority"
    assert plain not in page, "another queue's job is not listed"
    default = viewer.get(f"{BASE}jobs/?stage=enqueued").content.decode()
    assert plain in default and low not in default
    refused = viewer.get(f"{BASE}jobs/?stage=failed&queue=emails")
    assert b"set stage=enqueued" in refused.content


def test_overview_shows_each_live_servers_version(queued: LaterDb, operator: Client) -> None:
    """The servers panel names each server's release; a server of a release
    before versions were recorded (its row has none) shows "unrecorded"."""
    live_server_serving(queued, "old-7-c", None)
    with connections[queued.alias].cursor() as cursor:
        dialect_for(queued.alias).cluster.server_heartbeat(
            cursor,
            Heartbeat(server_id="web-1-a", namespace="default", hostname="host", pid=1, workers=4,
                      version="9.9.9"),
        )  # fmt: skip
    servers = json.loads(operator.get(f"{BASE}api/overview").content)["servers"]
    assert {s["id"]: s["version"] for s in servers} == {"old-7-c": None, "web-1-a": "9.9.9"}
    page = operator.get(BASE).content.decode()
    rows = page.split('<table id="later-servers">', 1)[1].split("</table>", 1)[0]
    assert "<td>7</td><td>unrecorded</td>" in rows
    assert "<td>1</td><td>9.9.9</td>" in rows
