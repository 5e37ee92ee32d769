"""The admin dashboard in a real browser, on SQLite and PostgreSQL.

Chromium (tests/browser.py) drives pytest-django's live server while
``later_worker`` processes run the jobs; the live server, the workers and the
test share the test database (see tests/browser.py). Every wait is Playwright's
``expect`` or a poll with a deadline. Screenshots of every page, in the light
and the dark theme, are saved as artifacts (tests/artifacts/ or
``$LATER_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.cache import cache
from django.core.management import call_command
from playwright.sync_api import Page, expect

import later_django as later
from later_django.partitions.api import partition_of
from later_django.queues import pause_queue, paused_queues
from tests.browser import (
    VIEWPORT,
    admin_login,
    create_staff,
    force_login,
    screenshot,
    use_theme,
)
from tests.dashboard.test_dashboard import SERVER_ID, live_server_owning
from tests.dashboard.test_dashboard_queues import live_server_serving
from tests.helpers import history_stages, read_records, set_later
from tests.jobapp.jobs import AsyncHold, Gate, Noop, NoRetry, Ordered

# A real browser and real processes: Django's version changes nothing (tox.ini).
pytestmark = pytest.mark.one_env

DASHBOARD = "/admin/later/"
PERMISSIONS = ("later_django.view_dashboard", "later_django.change_job")
NOOP = "tests.jobapp.jobs.Noop"
WORKER_TIMEOUT_MS = 30_000  # a worker process starting and running the test's jobs
HOUR = timedelta(hours=1)
RETRIED_ONE = re.compile(r"^\s*1 job retried\.\s*$")


@pytest.fixture
def operator(later_db, live_server, page, settings) -> Page:
    """``page``, logged into the admin as staff allowed to view the dashboard
    and to act on jobs (the login form is test_staff_logs_into_the_admin's)."""
    cache.clear()  # the overview is cached a second per process: none from an earlier test
    force_login(page, live_server.url, create_staff(settings, "operator", permissions=PERMISSIONS))
    return page


def stage_count(page: Page, stage: str):
    return page.locator(f'[data-stage-count="{stage}"]')


def job_row(page: Page, job_id: str):
    return page.locator(f'table#later-jobs tbody tr[data-job-id="{job_id}"]')


def job_rows(page: Page):
    return page.locator("table#later-jobs tbody tr[data-job-id]")


def test_staff_logs_into_the_admin(live_server, page, settings):
    """The chain works: the live server's login page renders in chromium, a
    staff user's login lands on the admin index, and its entry opens the
    dashboard (on SQLite's LATER database; the other tests run on both)."""
    staff = create_staff(settings, permissions=PERMISSIONS)
    page.goto(f"{live_server.url}/admin/")
    expect(page).to_have_url(f"{live_server.url}/admin/login/?next=/admin/")
    expect(page.locator("#login-form")).to_be_visible()
    admin_login(page, live_server.url, staff)
    expect(page.locator("#user-tools")).to_contain_text(staff.username)
    expect(page.locator("#site-name")).to_have_text("Django administration")
    page.locator('a[href="/admin/later_django/dashboard/"]').first.click()
    expect(page).to_have_url(f"{live_server.url}{DASHBOARD}")
    expect(page.locator(".later-tabs [aria-current=page]")).to_have_text("Overview")


def test_job_detail_opens_from_the_jobs_list(later_db, live_server, operator):
    """A row of the jobs list opens the job's page; a continuation's page links
    to its parent and the parent's page lists it."""
    other = later.enqueue(Noop(n=1))
    parent = later.enqueue(NoRetry())
    child = later.enqueue_continue(parent, Noop(n=2))
    page = operator

    page.goto(f"{live_server.url}{DASHBOARD}")
    page.get_by_role("link", name="Jobs", exact=True).click()
    expect(page).to_have_url(f"{live_server.url}{DASHBOARD}jobs/")
    # The recent list: every job, the waiting continuation too, newest first.
    expect(page.locator(".later-stages a").first).to_contain_text("recent")
    expect(page.locator(".later-stages [aria-current=page]")).to_contain_text("recent")
    expect(job_rows(page)).to_have_count(3)
    assert job_rows(page).evaluate_all("rows => rows.map(r => r.dataset.jobId)") == [
        child,
        parent,
        other,
    ]
    expect(job_row(page, other)).to_contain_text(NOOP)
    job_row(page, parent).locator("a.later-id").click()

    expect(page).to_have_url(f"{live_server.url}{DASHBOARD}jobs/{parent}/")
    expect(page.locator("h2 code")).to_have_text(parent)
    expect(page.locator("#later-job-stage")).to_have_text("enqueued")
    expect(page.locator("#later-history li")).to_have_count(1)
    expect(page.locator("#later-history li")).to_contain_text("enqueued")
    expect(page.locator("#later-error")).to_have_count(0)
    page.locator(f'#later-children tr[data-job-id="{child}"] a').click()

    expect(page).to_have_url(f"{live_server.url}{DASHBOARD}jobs/{child}/")
    expect(page.locator("#later-job-stage")).to_have_text("waiting")
    expect(page.locator("#later-parent")).to_have_text(parent)


def test_failed_jobs_retried_from_the_list_and_the_job_page_succeed(
    later_db, live_server, workers, tmp_path, operator
):
    """Two jobs fail for good; once their cause is fixed, one is retried from
    the jobs list and one from its own page, and both succeed. A failed job
    nobody retried stays failed."""
    gate = tmp_path / "gate-open"
    from_list = later.enqueue(Gate(str(gate)))
    from_page = later.enqueue(Gate(str(gate)))
    untouched = later.enqueue(NoRetry())
    workers.start(workers=2)
    for job_id in (from_list, from_page, untouched):
        workers.wait_stage(job_id, "failed", WORKER_TIMEOUT_MS / 1000)
    page = operator

    page.goto(f"{live_server.url}{DASHBOARD}jobs/?stage=failed")
    expect(job_rows(page)).to_have_count(3)
    job_row(page, from_page).locator("a.later-id").click()
    expect(page.locator("#later-job-stage")).to_have_text("failed")
    expect(page.locator("#later-error")).to_contain_text("the gate is closed")
    expect(page.locator("#later-history li")).to_have_count(3)  # enqueued, running, failed

    gate.touch()
    page.go_back()
    job_row(page, from_list).locator('input[name="job"]').check()
    page.locator('#later-actions button[name="action"][value="retry"]').click()
    expect(page.locator(".messagelist")).to_have_text(RETRIED_ONE)
    expect(job_row(page, from_list)).to_have_count(0)
    expect(job_rows(page)).to_have_count(2)

    page.goto(f"{live_server.url}{DASHBOARD}jobs/{from_page}/")
    page.locator('#later-actions button[name="action"][value="retry"]').click()
    expect(page.locator(".messagelist")).to_have_text(RETRIED_ONE)
    expect(page).to_have_url(f"{live_server.url}{DASHBOARD}jobs/{from_page}/")

    for job_id in (from_list, from_page):
        workers.wait_stage(job_id, "success", WORKER_TIMEOUT_MS / 1000)
        page.goto(f"{live_server.url}{DASHBOARD}jobs/{job_id}/")
        expect(page.locator("#later-job-stage")).to_have_text("success")
        stages = page.locator("#later-history li .later-stage").all_inner_texts()
        assert stages[:3] == ["enqueued", "running", "failed"], stages
        assert stages[-2:] == ["running", "success"], stages
        assert stages == history_stages(str(later_db.job_field(job_id, "history")))
        assert len(read_records(workers.record, "gate", job_id)) == 2
    assert later_db.stage_of(untouched) == "failed"


def test_bulk_cancel_of_a_filtered_list(later_db, live_server, operator):
    """Filtering the list by type and cancelling "every job matching this
    filter" after the confirmation cancels those jobs and no other."""
    noops = later.enqueue_many(Noop(n=i) for i in range(4))
    others = [later.enqueue(NoRetry()) for _ in range(2)]
    delayed_noop = later.enqueue_delayed(Noop(n=9), HOUR)  # another stage: not in the filter
    page = operator

    page.goto(f"{live_server.url}{DASHBOARD}jobs/?stage=enqueued")
    expect(job_rows(page)).to_have_count(6)
    page.locator('#later-filter input[name="type"]').fill(NOOP)
    page.locator("#later-filter button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"type=tests\.jobapp\.jobs\.Noop"))
    expect(job_rows(page)).to_have_count(4)
    for job_id in noops:
        expect(job_row(page, job_id)).to_be_visible()

    page.locator('#later-bulk select[name="action"]').select_option("cancel")
    page.locator("#later-all-matching").click()
    confirm = page.locator("#later-confirm")
    expect(confirm).to_contain_text("cancelled")
    expect(confirm).to_contain_text(NOOP)
    expect(confirm).to_contain_text("enqueued")
    confirm.locator('button[name="confirm"][value="1"]').click()

    expect(page.locator(".messagelist")).to_contain_text("4 jobs cancelled.")
    expect(page).to_have_url(re.compile(r"/admin/later/jobs/\?.*type=tests\.jobapp\.jobs\.Noop"))
    expect(job_rows(page)).to_have_count(0)
    assert [later_db.stage_of(j) for j in noops] == ["cancelled"] * 4
    assert [later_db.stage_of(j) for j in others] == ["enqueued"] * 2
    assert later_db.stage_of(delayed_noop) == "delayed"

    page.goto(f"{live_server.url}{DASHBOARD}jobs/?stage=cancelled")
    expect(job_rows(page).locator(".later-stage")).to_have_text(["cancelled"] * 4)
    assert set(job_rows(page).evaluate_all("rows => rows.map(r => r.dataset.jobId)")) == set(noops)


def queue_row(page: Page, name: str):
    return page.locator(f'table#later-queues tbody tr[data-queue="{name}"]')


def test_queues_paused_and_resumed_through_the_buttons(later_db, live_server, settings, operator):
    """The Queues tab lists each declared queue with its ready jobs and the
    servers serving it, and warns about the queue that none serves. Its
    Pause button pauses the queue for every server, and the pause is still
    there after a reload; Resume undoes it, and that too outlasts a reload."""
    set_later(settings, QUEUES={"default": {}, "emails": {}})
    later.enqueue_many(Noop(n=i) for i in range(2))
    for n in range(3):
        later.enqueue(Noop(n=n), queue="emails")
    live_server_serving(later_db, SERVER_ID, "default")
    page = operator

    page.goto(f"{live_server.url}{DASHBOARD}")
    page.get_by_role("link", name="Queues", exact=True).click()
    expect(page).to_have_url(f"{live_server.url}{DASHBOARD}queues/")
    expect(page.locator(".later-tabs [aria-current=page]")).to_have_text("Queues")
    rows = page.locator("table#later-queues tbody tr[data-queue]")
    expect(rows).to_have_count(2)
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.queue)") == ["default", "emails"]
    default, emails = queue_row(page, "default"), queue_row(page, "emails")
    expect(default.locator('[data-count="ready"]')).to_have_text("2")
    expect(emails.locator('[data-count="ready"]')).to_have_text("3")
    expect(default.locator(".later-server-id")).to_have_text(SERVER_ID)
    expect(default.locator(".later-warning")).to_have_count(0)
    expect(emails.locator(".later-warning")).to_contain_text("no live server serves this queue")

    emails.get_by_role("button", name="Pause").click()
    expect(page.locator(".messagelist")).to_contain_text("Queue emails paused")
    expect(emails.locator("[data-state]")).to_have_attribute("data-state", "paused")
    expect(emails.get_by_role("button", name="Pause")).to_have_count(0)
    expect(default.get_by_role("button", name="Pause")).to_be_visible()
    assert paused_queues() == {"emails"}

    page.reload()
    expect(page.locator(".messagelist")).to_have_count(0)
    expect(emails.locator("[data-state]")).to_have_attribute("data-state", "paused")
    expect(emails.locator("[data-state]")).to_contain_text("since")
    emails.get_by_role("button", name="Resume").click()
    expect(page.locator(".messagelist")).to_contain_text("Queue emails resumed")
    expect(emails.locator("[data-state]")).to_have_attribute("data-state", "running")
    assert paused_queues() == set()

    page.reload()
    expect(emails.locator("[data-state]")).to_have_attribute("data-state", "running")
    expect(emails.get_by_role("button", name="Pause")).to_be_visible()
    expect(emails.get_by_role("button", name="Resume")).to_have_count(0)


def test_a_viewer_sees_the_queues_without_buttons(later_db, live_server, page, settings):
    """Without the change permission the Queues tab shows every queue and
    its state, and no Pause or Resume button."""
    set_later(settings, QUEUES={"default": {}, "emails": {}})
    assert pause_queue("emails")
    force_login(
        page,
        live_server.url,
        create_staff(settings, "viewer", permissions=("later_django.view_dashboard",)),
    )
    page.goto(f"{live_server.url}{DASHBOARD}queues/")
    expect(page.locator("table#later-queues tbody tr[data-queue]")).to_have_count(2)
    state = queue_row(page, "emails").locator("[data-state]")
    expect(state).to_have_attribute("data-state", "paused")
    expect(page.locator("table#later-queues button")).to_have_count(0)


def _dark_background(page: Page) -> bool:
    """Whether the page's body background is dark (luminance below half)."""
    rgb = page.evaluate("getComputedStyle(document.body).backgroundColor")
    red, green, blue = (int(v) for v in re.findall(r"\d+", rgb)[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) < 128


# The color of an element's text, and of the first background behind it that
# is not transparent (its own, or an ancestor's), as [r, g, b].
COLORS_JS = """el => {
    const rgb = c => c.match(/[\\d.]+/g).slice(0, 4).map(Number);
    let node = el, bg = rgb(getComputedStyle(node).backgroundColor);
    while ((bg.length === 4 && bg[3] === 0) && node.parentElement) {
        node = node.parentElement;
        bg = rgb(getComputedStyle(node).backgroundColor);
    }
    return [rgb(getComputedStyle(el).color).slice(0, 3), bg.slice(0, 3)];
}"""


def _contrast(first: list[float], second: list[float]) -> float:
    """WCAG's contrast ratio of two sRGB colors (1 to 21)."""

    def luminance(rgb: list[float]) -> float:
        linear = [
            c / 255 / 12.92 if c <= 10.31 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb
        ]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_the_job_id_in_the_job_header_is_readable_in_both_themes(later_db, live_server, operator):
    """The job's id in its panel's header contrasts with what is behind it by
    at least WCAG's 4.5:1 for text, in the light and the dark theme."""
    job_id = later.enqueue(Noop(n=1))
    page = operator
    for theme in ("light", "dark"):
        use_theme(page, theme)
        page.goto(f"{live_server.url}{DASHBOARD}jobs/{job_id}/")
        header_id = page.locator(".later-panel h2 code")
        expect(header_id).to_have_text(job_id)
        assert _dark_background(page) is (theme == "dark")
        text, background = header_id.evaluate(COLORS_JS)
        ratio = _contrast(text, background)
        assert ratio >= 4.5, (theme, text, background, round(ratio, 2))


def test_servers_and_owners_are_shown_by_their_full_ids(later_db, live_server, settings, operator):
    """The overview's servers, as its script redraws them every second, and
    the topics page's partition owners show the whole server id."""
    set_later(settings, TOPICS={"ordered": 2})
    call_command("later_migrate", verbosity=0)
    live_server_owning(later_db, SERVER_ID, "ordered", 1)
    page = operator

    page.goto(f"{live_server.url}{DASHBOARD}")
    expect(page.locator("body")).to_have_attribute("data-refreshed", re.compile(r"[1-9]"))
    expect(page.locator("#later-servers tbody td").first).to_have_text(SERVER_ID)
    page.goto(f"{live_server.url}{DASHBOARD}topics/")
    owner = page.locator('[data-topic="ordered"] tr[data-partition="1"] .later-server-id')
    expect(owner).to_have_text(SERVER_ID)


def test_times_are_in_the_admin_time_zone_whatever_the_browser_zone(
    later_db, live_server, browser, settings
):
    """A browser in Tokyo shows the admin's times as the server wrote them:
    in the admin's zone (here Europe/Paris), named, and not turned into the
    browser's own zone, which would leave the reader to guess."""
    settings.TIME_ZONE = "Europe/Paris"
    job_id = later.enqueue_delayed(Noop(n=1), HOUR)
    # 2026-01-15 12:00:00.250 and 2026-07-15 12:00:00 UTC.
    changed = later_db.execute(
        "UPDATE later_job SET created_ms = %s, run_at_ms = %s WHERE id = %s",
        [1_768_478_400_250, 1_784_116_800_000, job_id],
    )
    assert changed == 1
    context = browser.new_context(viewport=VIEWPORT, timezone_id="Asia/Tokyo")
    try:
        page = context.new_page()
        force_login(page, live_server.url, create_staff(settings, permissions=PERMISSIONS))
        page.goto(f"{live_server.url}{DASHBOARD}jobs/{job_id}/")
        assert page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone") == "Asia/Tokyo"
        times = page.locator(".later-fields time")
        expect(times.nth(0)).to_have_text("2026-01-15 13:00:00.250 CET")
        expect(times.nth(1)).to_have_text("2026-07-15 14:00:00.000 CEST")
        for text in page.locator("time").all_inner_texts():
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} CES?T", text), text
    finally:
        context.close()


def test_the_queue_graph_has_a_time_axis_in_the_admin_time_zone(
    later_db, live_server, settings, operator
):
    """The queue-length graph's x axis is labelled with round times of the
    admin's zone (Asia/Kolkata: 05:30 ahead of UTC, so its hours are not
    UTC's), each under the time it stands for, a date where the day
    changes, and the zone named at its end."""
    settings.TIME_ZONE = "Asia/Kolkata"
    zone = ZoneInfo("Asia/Kolkata")
    now = later_db.now_ms() // 60_000 * 60_000
    for minutes in range(0, 20 * 60, 20):  # 20 h of samples, one every 20 min
        later_db.execute(
            "INSERT INTO later_queue_sample (namespace, at_ms, ready, scheduled, running, "
            "waiting, partitioned) VALUES ('default', %s, %s, 0, 0, 0, 0)",
            [now - minutes * 60_000, minutes],
        )
    page = operator
    page.goto(f"{live_server.url}{DASHBOARD}")
    axis = page.locator("#later-queue-axis")
    expect(axis.locator(".later-axis-zone")).to_have_text("IST")
    ticks = axis.locator(".later-tick")
    expect(ticks.first).to_be_attached()
    shown = ticks.evaluate_all(
        "ts => ts.map(t => [Number(t.dataset.ms), t.textContent, t.getBoundingClientRect().x])"
    )
    assert 4 <= len(shown) <= 8, shown
    days = []
    for at_ms, text, _ in shown:
        local = datetime.fromtimestamp(at_ms / 1000, zone)
        assert (local.minute, local.second, local.hour % 3) == (0, 0, 0), (local, text)
        assert now - 20 * 3_600_000 <= at_ms <= now, (at_ms, text)
        day = local.strftime("%m-%d")
        expected = local.strftime("%H:%M") if day in days else f"{day} {local:%H:%M}"
        days.append(day)
        assert text == expected, (local, text)
    assert [x for _, _, x in shown] == sorted(x for _, _, x in shown)


def test_overview_follows_a_worker_then_every_page_in_both_themes(
    later_db, live_server, workers, tmp_path, settings, operator
):
    """The overview's counts follow a worker as it runs the jobs, refreshed by
    the page itself (no reload), with the worker among the servers. Then every
    page on that busy queue, in the light and the dark theme: each shows its
    content, the dark theme is dark, and a PNG of each is saved. (One test:
    the worker and the queue serve both, and CI time is short.)"""
    # The worker serves "default" and "emails"; "reports" is declared here only.
    served = {"default": {}, "emails": {}}
    set_later(settings, TOPICS={"ordered": 4}, QUEUES={**served, "reports": {}})
    # Daily and weekly, about half a day from now: none falls due during the test.
    hour = (datetime.now(UTC).hour + 12) % 24
    later.enqueue_recurring("daily-report", Noop(n=0), f"0 {hour} * * *", tz="Europe/Paris")
    later.enqueue_recurring("weekly-sync", Noop(n=1), f"30 {hour} * * 1")
    succeeded = later.enqueue_many(Noop(n=i) for i in range(12))
    failed = [later.enqueue(Gate(str(tmp_path / "closed"))), later.enqueue(NoRetry())]
    page = operator
    base = f"{live_server.url}{DASHBOARD}"

    page.goto(base)
    expect(stage_count(page, "enqueued")).to_have_text("14")
    expect(stage_count(page, "delayed")).to_have_text("2")  # the schedules' next occurrences
    expect(stage_count(page, "success")).to_have_text("0")
    expect(page.locator("#later-servers")).to_contain_text("No live server.")
    page.evaluate("window.laterSameDocument = true")
    worker = workers.start(
        workers=2,
        timings={"SHUTDOWN_TIMEOUT": 0.5},
        env={"LATER_TEST_SETTINGS": json.dumps({"QUEUES": served})},
    )
    expect(stage_count(page, "success")).to_have_text("12", timeout=WORKER_TIMEOUT_MS)
    expect(stage_count(page, "failed")).to_have_text("2")
    expect(stage_count(page, "enqueued")).to_have_text("0")
    expect(page.locator("#later-servers tbody")).to_contain_text(str(worker.pid))
    expect(page.locator("#later-servers tbody")).to_contain_text(later.__version__)
    assert page.evaluate("window.laterSameDocument") is True, "the counts came without a reload"
    worker_id = later_db.scalar("SELECT id FROM later_server WHERE pid = %s", [worker.pid])
    stages = [later_db.stage_of(job_id) for job_id in (*succeeded, *failed)]
    assert stages == ["success"] * 12 + ["failed"] * 2

    # Two jobs hold both workers of the default queue, so what comes next
    # stays queued; "emails" is paused, and no server serves "reports".
    holding = [later.enqueue(AsyncHold(seconds=60, n=i)) for i in range(2)]
    for job_id in holding:
        workers.wait_stage(job_id, "running", WORKER_TIMEOUT_MS / 1000)
    keys = ("alice", "bob", "carol")
    for key in keys:
        for n in range(3):
            later.enqueue_to_partition(Ordered(key=key, n=n))
    later.enqueue_many(Noop(n=i) for i in range(5))
    for n in range(3):
        later.enqueue_delayed(Noop(n=n), HOUR * (n + 1))
    later.cancel(later.enqueue_delayed(Noop(n=3), HOUR))
    assert pause_queue("emails")
    for n in range(4):
        later.enqueue(Noop(n=n), queue="emails")
    for n in range(2):
        later.enqueue(Noop(n=n), queue="reports")
    counts = later.stage_counts()
    assert (counts["success"], counts["failed"], counts["running"]) == (12, 2, 2), counts
    cache.clear()  # the overview a second old: the counts now, at once
    # The day before, one sample every 10 minutes (the leader takes one a
    # minute): the graph, and its screenshot, have a shape and a time axis.
    now = later_db.now_ms() // 60_000 * 60_000
    for minutes in range(10, 24 * 60, 10):
        ready = round(40 + 30 * math.sin(minutes / 180))
        partitioned = round(12 + 8 * math.cos(minutes / 120))
        later_db.execute(
            "INSERT INTO later_queue_sample (namespace, at_ms, ready, scheduled, running, "
            "waiting, partitioned) VALUES ('default', %s, %s, 5, 2, 0, %s)",
            [now - minutes * 60_000, ready, partitioned],
        )

    for theme in ("light", "dark"):
        use_theme(page, theme)
        prefix = f"dashboard-{later_db.vendor}-{theme}"

        page.goto(base)
        expect(page.locator("body")).to_have_attribute("data-refreshed", re.compile(r"[1-9]"))
        for stage in ("success", "failed", "running", "enqueued", "delayed", "cancelled"):
            expect(stage_count(page, stage)).to_have_text(str(counts[stage]))
        expect(page.locator("#later-servers tbody")).to_contain_text(str(worker.pid))
        # The worker's per-second figures of the last minute (written about once a second).
        expect(page.locator('[data-field="throughput.succeeded"]')).to_have_text("12")
        expect(page.locator('[data-field="throughput.failed"]')).to_have_text("2")
        expect(page.locator("#later-queue-graph > *").first).to_be_attached()
        expect(page.locator("#later-queue-axis .later-tick")).not_to_have_count(0)
        assert page.evaluate("document.documentElement.dataset.theme") == theme
        assert _dark_background(page) is (theme == "dark")
        screenshot(page, f"{prefix}-overview")

        page.goto(f"{base}jobs/")  # the recent list: every job, newest first
        expect(job_rows(page)).to_have_count(sum(counts.values()))
        screenshot(page, f"{prefix}-jobs")

        page.goto(f"{base}jobs/{failed[0]}/")
        expect(page.locator("#later-error")).to_contain_text("the gate is closed")
        screenshot(page, f"{prefix}-job")

        page.goto(f"{base}topics/")
        topic = page.locator('[data-topic="ordered"]')
        expect(topic.locator("h2 .later-badge")).to_have_text("9")
        partitions = topic.locator("tbody tr[data-partition]")
        # Every partition of the registered topic, the empty ones at depth 0.
        expect(partitions).to_have_count(4)
        with_jobs = {partition_of("ordered", key) for key in keys}
        for empty in set(range(4)) - with_jobs:
            expect(topic.locator(f'tr[data-partition="{empty}"] td').nth(1)).to_have_text("0")
        screenshot(page, f"{prefix}-topics")

        page.goto(f"{base}queues/")
        expect(queue_row(page, "default").locator('[data-count="running"]')).to_have_text("2")
        expect(queue_row(page, "emails").locator("[data-state]")).to_contain_text("paused")
        expect(queue_row(page, "emails").locator(".later-server-id")).to_have_text(worker_id)
        expect(queue_row(page, "reports").locator(".later-warning")).to_be_visible()
        screenshot(page, f"{prefix}-queues")

        page.goto(f"{base}recurring/")
        expect(page.locator("#later-recurring tbody tr")).to_have_count(2)
        expect(page.locator("#later-recurring")).to_contain_text("daily-report")
        expect(page.locator("#later-recurring")).to_contain_text("Europe/Paris")
        assert _dark_background(page) is (theme == "dark")
        screenshot(page, f"{prefix}-recurring")
