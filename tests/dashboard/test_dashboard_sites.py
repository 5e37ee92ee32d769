"""The dashboard mounted on an admin site of its own (tests/urls.py mounts
it at /ops/ as well as the default /admin/): every URL a page renders or
redirects to stays within the site the page was served from."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.test import Client

import later_django as later
from later_django.queues import paused_queues
from later_django.testing import drain
from tests.helpers import LaterDb, set_later
from tests.jobapp.jobs import Noop, NoRetry

SITES = {"admin": "/admin/", "ops": "/ops/"}
URL_ATTRIBUTE = re.compile(r'\s(?:href|action|src|data-[\w-]+)="([^"]*)"')


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


@pytest.fixture
def operator(later_db: LaterDb) -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    for codename in ("view_dashboard", "change_job"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="later_django", codename=codename)
        )
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _urls(html: str) -> list[str]:
    """The URLs of a page's links, forms and data attributes that name a
    path (a relative ``?query`` link keeps the page's path)."""
    return [u for u in URL_ATTRIBUTE.findall(html) if u.startswith("/")]


def _within(prefix: str, html: str) -> list[str]:
    """Assert every path the page names is in the site at ``prefix`` (or a
    static file, or the admin's "view site" link); return the paths."""
    urls = _urls(html)
    strays = [u for u in urls if not (u.startswith((prefix, "/static/")) or u == "/")]
    assert not strays, f"URLs outside {prefix}: {strays}"
    return urls


def _get(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def _form(html: str, form_id: str) -> tuple[str, dict[str, str]]:
    """The action and hidden fields of the page's form ``form_id``."""
    form = html.split(f'id="{form_id}"', 1)[1].split("</form>", 1)[0]
    [action] = re.findall(r'action="([^"]*)"', html.split(f'id="{form_id}"', 1)[0][-400:])
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))
    return action, hidden


@pytest.mark.parametrize("site", sorted(SITES))
def test_dashboard_sites_pages_link_within_their_site(operator: Client, site: str) -> None:
    """The overview, a job list, a job page and the bulk confirmation served
    from a site name only that site's URLs: tabs, breadcrumbs, job links,
    form actions, the JSON URLs the script polls, the admin index's entry."""
    prefix = SITES[site]
    base = f"{prefix}later/"
    parent = later.enqueue(NoRetry())
    drain()
    child = later.enqueue_continue(later.enqueue(Noop()), Noop())
    later.enqueue(Noop())

    index = _get(operator, prefix)
    assert f"{prefix}later_django/dashboard/" in _within(prefix, index)
    entry = operator.get(f"{prefix}later_django/dashboard/")
    assert entry.status_code == 302 and entry["Location"] == base

    overview = _get(operator, base)
    urls = _within(prefix, overview)
    for expected in (prefix, f"{base}jobs/", f"{base}api/overview", f"{base}api/samples"):
        assert expected in urls, expected

    jobs = _get(operator, f"{base}jobs/?stage=enqueued")
    urls = _within(prefix, jobs)
    assert f"{base}actions/" in urls
    assert any(u.startswith(f"{base}jobs/") and len(u) > len(f"{base}jobs/") for u in urls)

    failed = _get(operator, f"{base}jobs/?stage=failed")
    assert f"{base}jobs/{parent}/" in _within(prefix, failed)

    job = _get(operator, f"{base}jobs/{child}/")
    urls = _within(prefix, job)
    assert f"{base}actions/" in urls and f"{base}jobs/" in urls

    whole_id = operator.get(f"{base}jobs/?q={child}")
    assert whole_id.status_code == 302 and whole_id["Location"] == f"{base}jobs/{child}/"

    token = operator.cookies["csrftoken"].value
    confirm = operator.post(
        f"{base}actions/",
        {"action": "cancel", "all_matching": "1", "stage": "delayed", "csrfmiddlewaretoken": token},
    )
    assert confirm.status_code == 200
    assert f"{base}actions/" in _within(prefix, confirm.content.decode())


@pytest.mark.parametrize("site", sorted(SITES))
def test_dashboard_sites_actions_post_and_redirect_within_their_site(
    later_db: LaterDb, operator: Client, site: str
) -> None:
    """A job page's action form posts to its own site, the action takes
    effect, and the redirects after it (back to the page, or to the
    overview without a ``next``) stay in that site."""
    prefix = SITES[site]
    base = f"{prefix}later/"
    first, second = later.enqueue(Noop()), later.enqueue(Noop())

    page = f"{base}jobs/{first}/"
    action, hidden = _form(_get(operator, page), "later-actions")
    assert action == f"{base}actions/"
    done = operator.post(action, {**hidden, "action": "cancel"})
    assert done.status_code == 302 and done["Location"] == page
    assert later_db.stage_of(first) == "cancelled"

    token = operator.cookies["csrftoken"].value
    done = operator.post(action, {"action": "cancel", "job": second, "csrfmiddlewaretoken": token})
    assert done.status_code == 302 and done["Location"] == base
    assert later_db.stage_of(second) == "cancelled"
    none = operator.post(action, {"action": "cancel", "csrfmiddlewaretoken": token})
    assert none.status_code == 302 and none["Location"] == base


@pytest.mark.parametrize("site", sorted(SITES))
def test_dashboard_sites_queue_pause_posts_and_redirects_within_their_site(
    later_db: LaterDb, operator: Client, settings: object, site: str
) -> None:
    """The Queues page names only its site's URLs; its Pause form posts to
    that site and comes back to the page, and a pause without a ``next``
    lands on that site's Queues page."""
    set_later(settings, QUEUES={"default": {}, "emails": {}})
    prefix = SITES[site]
    base = f"{prefix}later/"
    page = _get(operator, f"{base}queues/")
    urls = _within(prefix, page)
    assert f"{base}queues/" in urls and f"{base}queues/actions/" in urls

    form = page.split('data-queue="emails"', 1)[1].split("</form>", 1)[0]
    [action] = re.findall(r'action="([^"]*)"', form)
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))
    assert action == f"{base}queues/actions/" and hidden["next"] == f"{base}queues/"
    done = operator.post(action, {**hidden, "action": "pause"})
    assert done.status_code == 302 and done["Location"] == f"{base}queues/"
    assert paused_queues() == {"emails"}

    token = operator.cookies["csrftoken"].value
    done = operator.post(
        action, {"action": "resume", "queue": "emails", "csrfmiddlewaretoken": token}
    )
    assert done.status_code == 302 and done["Location"] == f"{base}queues/"
    assert paused_queues() == set()
