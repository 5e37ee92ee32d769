"""The dashboard's actions (POST /admin/later/actions/) through Django's test
client, as an operator allowed to view the dashboard and change jobs, on
SQLite and PostgreSQL: retry (with the continuations it revives), cancel,
run now, force-fail of a partition head, "every job matching this filter"
with its confirmation and its time budget, and the requests it refuses."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.test import Client

import later_django as later
from later_django.dashboard import actions
from later_django.partitions.hashing import partition_for_key
from later_django.testing import drain
from tests.helpers import LaterDb, history_stages, read_records, set_later
from tests.jobapp.jobs import Gate, Noop, NoRetry, Ordered, Refresh

# Django's version changes nothing in what these check (later's SQL and
# actions): they run in the first tox env only (tox.ini), like the process tests.
pytestmark = pytest.mark.one_env

BASE = "/admin/later/"
ACTIONS = f"{BASE}actions/"
HOUR = timedelta(hours=1)
NOOP = "tests.jobapp.jobs.Noop"
TOPICS = {"ordered": 4}
STAGES = ("enqueued", "running", "failed", "success")
RETRY_REFUSED = (
    "only a failed job can be retried: not a partition job, nor a continuation that failed "
    "because its parent did, which a retry of its parent revives"
)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


@pytest.fixture
def operator(later_db: LaterDb) -> Client:
    """A staff user allowed to view the dashboard and to act on jobs."""
    user = User.objects.create(username="operator", is_staff=True)  # no password to hash
    for codename in ("view_dashboard", "change_job"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="later_django", codename=codename)
        )
    # A 500 is a status to assert on, not an exception out of the client.
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def topics(later_db: LaterDb, settings: object) -> LaterDb:
    set_later(settings, TOPICS=TOPICS)
    return later_db


def act(client: Client, action: str, *job_ids: str, **fields: str) -> str:
    """POST ``action`` on ``job_ids``, follow the redirect; return the one
    message it shows (the page's text, unescaped)."""
    data: dict[str, object] = {"action": action, "job": list(job_ids), **fields}
    response = client.post(ACTIONS, data, follow=True)
    assert response.status_code == 200, response.content[:500]
    assert len(response.redirect_chain) == 1 and response.redirect_chain[0][1] == 302
    shown = [str(m) for m in response.context["messages"]]
    assert len(shown) == 1, shown
    assert shown[0] in html.unescape(response.content.decode())
    return shown[0]


def counts_match_the_truth(later_db: LaterDb) -> None:
    """The stage counters the dashboard shows equal a count of the rows."""
    truth = dict(later_db.rows("SELECT stage, COUNT(*) FROM later_job GROUP BY stage"))
    assert {k: v for k, v in later.stage_counts().items() if v} == truth


# -- retry -----------------------------------------------------------------------------
def test_a_failed_job_retried_runs_again_and_succeeds(
    later_db: LaterDb, operator: Client, tmp_path: Path, record: Path
) -> None:
    gate = tmp_path / "gate-open"
    job_id = later.enqueue(Gate(str(gate)))
    other = later.enqueue(NoRetry())
    drain()
    assert later_db.stage_of(job_id) == "failed"
    failed_at = later_db.job_field(job_id, "finished_ms")
    assert failed_at is not None

    gate.touch()
    message = act(operator, "retry", job_id, next=f"{BASE}jobs/?stage=failed")
    assert message.startswith("1 job retried"), message  # the whole text: the test below
    stage, attempts, history = later_db.job_row(job_id)
    assert (stage, attempts) == ("enqueued", 1)
    assert history_stages(history) == ["enqueued", "running", "failed", "enqueued"]
    assert later_db.job_field(job_id, "finished_ms") is None
    assert later_db.job_field(job_id, "expires_ms") is None, "a retried job is not deleted"
    assert int(later_db.job_field(job_id, "run_at_ms")) >= int(failed_at)  # type: ignore[arg-type]
    assert later_db.stage_of(other) == "failed", "only the job named was retried"
    counts_match_the_truth(later_db)

    runs = drain()
    assert [(r.job_id, r.attempt, r.outcome) for r in runs] == [(job_id, 2, "succeeded")]
    stage, attempts, history = later_db.job_row(job_id)
    assert (stage, attempts) == ("success", 2)
    assert history_stages(history)[-3:] == ["enqueued", "running", "success"]
    assert [r.attempt for r in read_records(record, "gate", job_id)] == [1, 2]
    assert later_db.stage_of(other) == "failed"
    counts_match_the_truth(later_db)


def test_retry_revives_the_continuations_that_failed_with_parent_failed(
    later_db: LaterDb, operator: Client, tmp_path: Path
) -> None:
    gate = tmp_path / "gate-open"
    parent = later.enqueue(Gate(str(gate)))
    child = later.enqueue_continue(parent, Noop(n=1))
    grandchild = later.enqueue_continue(child, Noop(n=2))
    sibling = later.enqueue_continue(parent, Noop(n=3))
    # A continuation that failed for a reason of its own stays failed.
    own_parent = later.enqueue(Noop(n=4))
    drain()
    for job_id in (child, grandchild, sibling):
        assert later_db.stage_of(job_id) == "failed"
        assert later_db.job_field(job_id, "last_error") == "parent failed"
    assert later_db.stage_of(own_parent) == "success"
    unrelated = later.enqueue(Gate(str(tmp_path / "never")))
    unrelated_child = later.enqueue_continue(unrelated, Noop(n=5))
    drain()
    assert later_db.stage_of(unrelated_child) == "failed"

    gate.touch()
    message = act(operator, "retry", parent)
    assert message.startswith("1 job retried"), message  # the whole text: the test below
    assert later_db.stage_of(parent) == "enqueued"
    for job_id in (child, grandchild, sibling):
        stage, attempts, history = later_db.job_row(job_id)
        assert (stage, attempts) == ("waiting", 0)
        assert history_stages(history) == ["waiting", "failed", "waiting"]
        assert later_db.job_field(job_id, "last_error") is None
        assert later_db.job_field(job_id, "expires_ms") is None
    assert later_db.stage_of(unrelated) == "failed"
    assert later_db.stage_of(unrelated_child) == "failed"
    counts_match_the_truth(later_db)

    runs = drain()
    assert [r.job_id for r in runs][0] == parent
    assert {r.job_id for r in runs} == {parent, child, grandchild, sibling}
    assert all(r.outcome == "succeeded" for r in runs)
    assert [r.job_id for r in runs].index(child) < [r.job_id for r in runs].index(grandchild)
    for job_id in (parent, child, grandchild, sibling):
        assert later_db.stage_of(job_id) == "success"
    counts_match_the_truth(later_db)


def test_retry_runs_the_parent_again_and_leaves_a_continuation_whose_key_was_taken_failed(
    later_db: LaterDb, operator: Client, tmp_path: Path
) -> None:
    """A unique continuation failed with its parent freed its key; a job that
    took the key since keeps it: the parent runs again, that continuation
    (and what waits on it) stays failed, a plain sibling waits again."""
    gate = tmp_path / "gate-open"
    parent = later.enqueue(Gate(str(gate)))
    unique_child = later.enqueue_continue(parent, Refresh(account=1))
    behind_it = later.enqueue_continue(unique_child, Noop(n=1))
    plain_child = later.enqueue_continue(parent, Noop(n=2))
    drain()
    assert later_db.job_field(unique_child, "last_error") == "parent failed"
    holder = later.enqueue(Refresh(account=1))
    assert holder != unique_child and not holder.duplicate

    gate.touch()
    message = act(operator, "retry", parent)
    assert message.startswith("1 job retried"), message
    assert later_db.stage_of(parent) == "enqueued"
    assert later_db.stage_of(plain_child) == "waiting"
    for job_id in (unique_child, behind_it):
        assert later_db.stage_of(job_id) == "failed"
        assert later_db.job_field(job_id, "last_error") == "parent failed"
    assert later_db.stage_of(holder) == "enqueued"
    counts_match_the_truth(later_db)
    runs = {r.job_id: r.outcome for r in drain()}
    assert runs == {parent: "succeeded", plain_child: "succeeded", holder: "succeeded"}


def test_retry_of_a_parent_whose_failed_continuations_share_a_key_revives_the_keyless_ones(
    later_db: LaterDb, operator: Client, tmp_path: Path
) -> None:
    """Two failed continuations with one key cannot both wait again: neither
    does, the parent and its continuations without a key do."""
    gate = tmp_path / "gate-open"
    parent = later.enqueue(Gate(str(gate)))
    first = later.enqueue_continue(parent, Refresh(account=1))
    drain()
    # Enqueued after its parent failed: stored failed, so the key was free.
    second = later.enqueue_continue(parent, Refresh(account=1, n=2))
    plain_child = later.enqueue_continue(parent, Noop(n=2))
    assert second != first
    for job_id in (first, second, plain_child):
        assert later_db.job_field(job_id, "last_error") == "parent failed"

    gate.touch()
    message = act(operator, "retry", parent)
    assert message.startswith("1 job retried"), message
    assert later_db.stage_of(parent) == "enqueued"
    assert later_db.stage_of(plain_child) == "waiting"
    assert [later_db.stage_of(job_id) for job_id in (first, second)] == ["failed", "failed"]
    counts_match_the_truth(later_db)


def test_the_retry_message_counts_the_revived_continuations(
    later_db: LaterDb, operator: Client, request: pytest.FixtureRequest
) -> None:
    lone = later.enqueue(NoRetry())
    parent = later.enqueue(NoRetry())
    child = later.enqueue_continue(parent, Noop(n=1))
    later.enqueue_continue(child, Noop(n=2))
    drain()

    assert act(operator, "retry", lone) == "1 job retried."
    assert act(operator, "retry", parent) == (
        "1 job retried; 2 continuations that had failed with 'parent failed' wait for it again."
    )


def test_a_bulk_retry_of_the_failed_list_keeps_continuations_behind_their_parent(
    later_db: LaterDb, operator: Client, tmp_path: Path
) -> None:
    """Retrying every failed job retries the parent, and its continuations
    that failed with 'parent failed' wait for it again, whatever order the
    list holds them in: they never run before (or without) their parent."""
    parent = later.enqueue(Gate(str(tmp_path / "gate-open")))
    child = later.enqueue_continue(parent, Noop(n=1))
    grandchild = later.enqueue_continue(child, Noop(n=2))
    drain()
    assert [later_db.stage_of(j) for j in (parent, child, grandchild)] == ["failed"] * 3

    fields = {"all_matching": "1", "confirm": "1", "stage": "failed"}
    assert act(operator, "retry", **fields) == (
        "1 job retried; 2 continuations that had failed with 'parent failed' wait for it "
        f"again; 2 left as they were ({RETRY_REFUSED})."
    )
    assert later_db.stage_of(parent) == "enqueued"
    assert [later_db.stage_of(j) for j in (child, grandchild)] == ["waiting"] * 2
    # The gate is still closed: the parent fails again, and its continuations with it.
    runs = drain()
    assert [(r.job_id, r.outcome) for r in runs] == [(parent, "failed")]
    assert [later_db.stage_of(j) for j in (child, grandchild)] == ["failed"] * 2


def test_a_retried_job_waits_from_its_retry_not_from_its_failure(
    later_db: LaterDb, operator: Client, tmp_path: Path
) -> None:
    """A job that sat failed an hour before it was retried from the
    dashboard and then succeeded: its page counts that hour as failed, and
    its waiting time starts again at the retry."""
    gate = tmp_path / "gate-open"
    job_id = later.enqueue(Gate(str(gate)))
    drain()
    assert later_db.stage_of(job_id) == "failed"
    # It failed an hour ago: every time it has, an hour earlier.
    history = str(later_db.job_field(job_id, "history"))
    earlier = "".join(
        f"{stage}@{int(at) - 3_600_000};"
        for stage, at in (entry.split("@") for entry in history.split(";") if entry)
    )
    later_db.execute(
        "UPDATE later_job SET history = %s, created_ms = created_ms - 3600000, "
        "run_at_ms = run_at_ms - 3600000, changed_ms = changed_ms - 3600000, "
        "finished_ms = finished_ms - 3600000, expires_ms = expires_ms - 3600000 WHERE id = %s",
        [earlier, job_id],
    )
    gate.touch()
    assert act(operator, "retry", job_id) == "1 job retried."
    drain()
    assert later_db.stage_of(job_id) == "success"

    job = operator.get(f"{BASE}api/jobs/{job_id}").json()
    at = {stage: [h["at_ms"] for h in job["history"] if h["stage"] == stage] for stage in STAGES}
    durations = job["durations_ms"]
    sat_failed = at["enqueued"][1] - at["failed"][0]
    assert sat_failed >= 3_600_000
    assert durations["failed"] == sat_failed
    # Before it ran first, and from the retry to its second run: never the hour.
    assert durations["waiting"] == (at["running"][0] - at["enqueued"][0]) + (
        at["running"][1] - at["enqueued"][1]
    )
    assert durations["waiting"] < 60_000
    assert durations["total"] == sum(durations[k] for k in ("processing", "failed", "waiting"))
    page = html.unescape(operator.get(f"{BASE}jobs/{job_id}/").content.decode())
    assert re.search(r'data-duration="failed">60\.0 min<', page), "an hour, shown as failed"


def test_retry_of_a_failed_partition_job_is_refused(topics: LaterDb, operator: Client) -> None:
    head = later.enqueue_to_partition(Ordered("k", 0))
    later.enqueue_to_partition(Ordered("k", 1))
    partition = later.get_job(head).partition  # type: ignore[union-attr]
    assert later.force_fail_partition_head("ordered", partition) == head
    history = topics.job_field(head, "history")

    message = act(operator, "retry", head)
    assert message == f"0 jobs retried; 1 left as they were ({RETRY_REFUSED})."
    assert topics.stage_of(head) == "failed"
    assert topics.job_field(head, "history") == history


def test_retry_leaves_a_failed_partition_continuation_failed(
    topics: LaterDb, operator: Client, tmp_path: Path
) -> None:
    """A partition continuation that failed with 'parent failed' stays failed
    when its plain parent is retried: the partition went on without it
    (a failed partition job is never run again), so it must not become the
    partition's head again, before the jobs enqueued after it."""
    parent = later.enqueue(Gate(str(tmp_path / "gate-open")))
    continuation = later.enqueue_continue_to_partition(parent, Ordered("k", 0))
    later.enqueue_to_partition(Ordered("k", 1))
    drain()
    assert topics.stage_of(parent) == "failed"
    assert topics.stage_of(continuation) == "failed"
    partition = later.get_job(continuation).partition  # type: ignore[union-attr]
    [stats] = [s for s in later.partition_stats() if s.partition == partition]
    head_before = stats.head_sequence

    act(operator, "retry", parent)
    assert topics.stage_of(continuation) == "failed"
    [stats] = [s for s in later.partition_stats() if s.partition == partition]
    assert stats.head_sequence == head_before


# -- cancel and run now ---------------------------------------------------------------
def test_cancel_a_pending_job_and_refuse_a_finished_one(
    later_db: LaterDb, operator: Client
) -> None:
    finished = later.enqueue(Noop(n=1))
    drain()
    assert later_db.stage_of(finished) == "success"
    pending = later.enqueue(Noop(n=2))
    delayed = later.enqueue_delayed(Noop(n=3), HOUR)
    requeued = later.enqueue_delayed(Noop(n=4), HOUR)
    later_db.execute("UPDATE later_job SET stage = 'requeued' WHERE id = %s", [requeued])
    parent = later.enqueue_delayed(Noop(n=5), HOUR)
    waiting = later.enqueue_continue(parent, Noop(n=6))
    behind = later.enqueue_continue(waiting, Noop(n=7))
    untouched = later.enqueue(Noop(n=8))

    message = act(operator, "cancel", pending, delayed, requeued, waiting)
    assert message == "4 jobs cancelled."
    for job_id in (pending, delayed, requeued, waiting):
        assert later_db.stage_of(job_id) == "cancelled"
    # As later_django.cancel does: what waited on a cancelled job fails.
    assert later_db.stage_of(behind) == "failed"
    assert later_db.job_field(behind, "last_error") == "parent failed"
    assert later_db.stage_of(parent) == "delayed"
    assert later_db.stage_of(untouched) == "enqueued"

    message = act(operator, "cancel", finished)
    assert message == (
        "0 jobs cancelled; 1 left as they were (only a job that has not started can be cancelled)."
    )
    assert later_db.stage_of(finished) == "success"
    counts_match_the_truth(later_db)


def test_actions_skip_an_id_that_is_no_job(later_db: LaterDb, operator: Client) -> None:
    pending = later.enqueue(Noop(n=1))
    for action, verb in (("retry", "retried"), ("run_now", "made due now")):
        for bad in ("not-a-job-id", "0" * 26):
            message = act(operator, action, bad)
            assert message.startswith(f"0 jobs {verb}; 1 left as they were"), message
    assert act(operator, "force_fail", "0" * 26).startswith("0 jobs force-failed; 1 left")
    assert later_db.stage_of(pending) == "enqueued"


def test_cancel_of_a_malformed_job_id_is_skipped_not_a_server_error(
    later_db: LaterDb, operator: Client
) -> None:
    pending = later.enqueue(Noop(n=1))
    response = operator.post(ACTIONS, {"action": "cancel", "job": ["not-a-job-id", pending]})
    assert response.status_code in (302, 400)
    if response.status_code == 302:
        assert later_db.stage_of(pending) == "cancelled"


def test_run_now_makes_a_delayed_job_due_at_once(later_db: LaterDb, operator: Client) -> None:
    delayed = later.enqueue_delayed(Noop(n=1), HOUR)
    later_one = later.enqueue_delayed(Noop(n=2), HOUR)
    requeued = later.enqueue_delayed(Noop(n=3), HOUR)
    later_db.execute("UPDATE later_job SET stage = 'requeued' WHERE id = %s", [requeued])
    enqueued = later.enqueue(Noop(n=4))
    assert [r.job_id for r in drain()] == [enqueued]
    before = later_db.now_ms()

    message = act(operator, "run_now", delayed, requeued)
    assert message == "2 jobs made due now."
    after = later_db.now_ms()
    for job_id in (delayed, requeued):
        stage, _, history = later_db.job_row(job_id)
        assert stage == "enqueued"
        assert history_stages(history)[-1] == "enqueued"
        assert before <= int(later_db.job_field(job_id, "run_at_ms")) <= after  # type: ignore[arg-type]
    assert later_db.stage_of(later_one) == "delayed"

    message = act(operator, "run_now", enqueued)
    assert message == (
        "0 jobs made due now; 1 left as they were (only a delayed or requeued job can be made due)."
    )
    assert {r.job_id for r in drain()} == {delayed, requeued}
    assert later_db.stage_of(later_one) == "delayed"
    counts_match_the_truth(later_db)


# -- force-fail of a partition head -------------------------------------------------
def test_force_fail_fails_only_the_head_and_the_next_job_becomes_the_head(
    topics: LaterDb, operator: Client
) -> None:
    head = later.enqueue_to_partition_delayed(Ordered("k", 0), HOUR)  # a poison head
    second = later.enqueue_to_partition(Ordered("k", 1))
    third = later.enqueue_to_partition(Ordered("k", 2))
    other_key = next(
        f"o{i}"
        for i in range(100)
        if partition_for_key(f"o{i}", TOPICS["ordered"])
        != partition_for_key("k", TOPICS["ordered"])
    )
    elsewhere = later.enqueue_to_partition(Ordered(other_key, 0))
    partition = later.get_job(head).partition  # type: ignore[union-attr]

    def head_of_partition() -> int | None:
        [stats] = [s for s in later.partition_stats() if s.partition == partition]
        return stats.head_sequence

    assert head_of_partition() == topics.job_field(head, "sequence")

    message = act(operator, "force_fail", second)  # not the head: refused
    assert message == (
        "0 jobs force-failed; 1 left as they were (only a job that was its partition's "
        "head can be force-failed)."
    )
    assert topics.stage_of(second) == "enqueued"

    message = act(operator, "force_fail", head)
    assert message == "1 job force-failed."
    assert topics.stage_of(head) == "failed"
    assert "force" in str(topics.job_field(head, "last_error"))
    assert [topics.stage_of(j) for j in (second, third, elsewhere)] == ["enqueued"] * 3
    assert head_of_partition() == topics.job_field(second, "sequence")
    listed = operator.get(
        f"{BASE}api/jobs?stage=enqueued&topic=ordered&partition={partition}"
    ).json()
    assert [j["id"] for j in listed["jobs"]] == [second, third]

    plain = later.enqueue(Noop())
    message = act(operator, "force_fail", plain)
    assert message.startswith("0 jobs force-failed; 1 left as they were")
    assert topics.stage_of(plain) == "enqueued"
    counts_match_the_truth(topics)


def test_force_fail_acts_only_on_the_heads_when_the_action_started(
    topics: LaterDb, operator: Client
) -> None:
    """Ticking a partition's first jobs, or force-failing every job of a
    topic, fails each partition's head once: the job that becomes the head
    meanwhile is left as it is."""
    head = later.enqueue_to_partition(Ordered("k", 0))
    second = later.enqueue_to_partition(Ordered("k", 1))
    third = later.enqueue_to_partition(Ordered("k", 2))
    message = act(operator, "force_fail", head, second)
    assert message.startswith("1 job force-failed; 1 left as they were")
    assert [topics.stage_of(j) for j in (head, second, third)] == ["failed", "enqueued", "enqueued"]

    fields = {"all_matching": "1", "confirm": "1", "topic": "ordered"}
    assert act(operator, "force_fail", **fields).startswith("1 job force-failed; 1 left")
    assert [topics.stage_of(j) for j in (second, third)] == ["failed", "enqueued"]


def test_force_fail_of_every_matching_job_needs_a_topic(topics: LaterDb, operator: Client) -> None:
    head = later.enqueue_to_partition(Ordered("k", 0))
    response = operator.post(
        ACTIONS, {"action": "force_fail", "all_matching": "1", "confirm": "1", "stage": "enqueued"}
    )
    assert response.status_code == 400
    assert b"needs a topic filter" in response.content
    assert topics.stage_of(head) == "enqueued"


# -- every job matching a filter ------------------------------------------------------
def test_every_matching_job_of_the_recent_list_is_refused(
    later_db: LaterDb, operator: Client
) -> None:
    """The recent list's filter holds every job in every stage: an action on
    all of them is refused, and its page offers none (ticked jobs only)."""
    jobs = later.enqueue_many(Noop(n=i) for i in range(3))
    for fields in ({}, {"stage": "recent"}, {"type": NOOP}):
        response = operator.post(
            ACTIONS, {"action": "cancel", "all_matching": "1", "confirm": "1", **fields}
        )
        assert response.status_code == 400, fields
        assert b"needs a stage" in response.content
    assert [later_db.stage_of(j) for j in jobs] == ["enqueued"] * 3
    page = operator.get(f"{BASE}jobs/").content.decode()
    assert 'id="later-actions"' in page and 'value="cancel"' in page
    assert 'id="later-bulk"' not in page
    assert 'id="later-bulk"' in operator.get(f"{BASE}jobs/?stage=enqueued").content.decode()


def test_bulk_cancel_confirms_first_then_cancels_exactly_the_matching_jobs(
    later_db: LaterDb, operator: Client
) -> None:
    noops = later.enqueue_many(Noop(n=i) for i in range(5))
    others = [later.enqueue(NoRetry()) for _ in range(3)]
    delayed_noop = later.enqueue_delayed(Noop(n=9), HOUR)  # another stage
    back = f"{BASE}jobs/?stage=enqueued&type={NOOP}"
    fields = {
        "action": "cancel",
        "all_matching": "1",
        "stage": "enqueued",
        "type": NOOP,
        "next": back,
    }

    confirm = operator.post(ACTIONS, fields)
    assert confirm.status_code == 200
    page = html.unescape(confirm.content.decode())
    assert 'id="later-confirm"' in page
    assert "cancelled" in page and NOOP in page
    assert re.search(r'name="confirm" value="1"', page)
    assert [later_db.stage_of(j) for j in noops] == ["enqueued"] * 5, "nothing changed yet"

    response = operator.post(ACTIONS, {**fields, "confirm": "1"})
    assert response.status_code == 302 and response["Location"] == back
    followed = operator.get(back)
    shown = [str(m) for m in followed.context["messages"]]
    assert shown == ["5 jobs cancelled."]
    assert [later_db.stage_of(j) for j in noops] == ["cancelled"] * 5
    assert [later_db.stage_of(j) for j in others] == ["enqueued"] * 3
    assert later_db.stage_of(delayed_noop) == "delayed"
    counts_match_the_truth(later_db)


def test_bulk_action_stops_at_its_time_budget_and_says_more_remain(
    later_db: LaterDb, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "BULK_BUDGET_SECONDS", 0)
    monkeypatch.setattr(actions, "BULK_PAGE", 4)
    noops = later.enqueue_many(Noop(n=i) for i in range(10))
    other = later.enqueue(NoRetry())
    fields = {"all_matching": "1", "confirm": "1", "stage": "enqueued", "type": NOOP}

    message = act(operator, "cancel", **fields)
    assert message == (
        "4 jobs cancelled; more jobs match the filter: run the action again to go on."
    )
    stages = [later_db.stage_of(j) for j in noops]
    assert stages == ["cancelled"] * 4 + ["enqueued"] * 6, "the first page, in list order"

    assert act(operator, "cancel", **fields).startswith("4 jobs cancelled; more jobs match")
    # The last page: the list ends, so nothing more is said to remain.
    assert act(operator, "cancel", **fields) == "2 jobs cancelled."
    assert [later_db.stage_of(j) for j in noops] == ["cancelled"] * 10
    assert later_db.stage_of(other) == "enqueued"
    counts_match_the_truth(later_db)


# -- refused requests ----------------------------------------------------------------
def test_unknown_action_get_and_unsafe_next_are_refused(
    later_db: LaterDb, operator: Client
) -> None:
    job_id = later.enqueue(Noop())

    unknown = operator.post(ACTIONS, {"action": "explode", "job": job_id})
    assert unknown.status_code == 400
    assert b"unknown action 'explode'" in unknown.content
    assert operator.get(ACTIONS).status_code == 405
    assert operator.get(f"{ACTIONS}?action=cancel&job={job_id}").status_code == 405
    assert later_db.stage_of(job_id) == "enqueued"

    for unsafe in ("http://evil.example/", "//evil.example/x", "https://evil.example/"):
        response = operator.post(ACTIONS, {"action": "run_now", "job": job_id, "next": unsafe})
        assert response.status_code == 302
        assert response["Location"] == BASE, unsafe
    operator.get(BASE)  # shows (and so consumes) the messages of those posts
    safe = f"{BASE}jobs/{job_id}/"
    response = operator.post(ACTIONS, {"action": "cancel", "job": job_id, "next": safe})
    assert response.status_code == 302 and response["Location"] == safe
    assert later_db.stage_of(job_id) == "cancelled"
    operator.get(safe)

    nothing = operator.post(ACTIONS, {"action": "cancel", "next": safe}, follow=True)
    assert [str(m) for m in nothing.context["messages"]] == [
        "No job was selected: tick the jobs to act on."
    ]
