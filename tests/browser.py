"""Real-browser tests: Playwright's sync API driving Debian's chromium.

A pytest plugin (listed in tests/conftest.py): the ``browser`` and ``page``
fixtures, and helpers to log a staff user into the admin of pytest-django's
``live_server``, pick the admin's theme and save screenshots.

The browser is Debian's ``chromium`` package (``/usr/bin/chromium``, or
``$LATER_TEST_CHROMIUM``), never one ``playwright install`` downloads: the
tests run where only the package registries are reachable. ``./dev test``
installs it with apt-get when missing.

One database for every process
------------------------------
The live server is a thread of the test process, so it opens the test
databases pytest-django created (their settings already name them), and a
``later_worker`` started by the ``workers`` fixture opens the same ones through
``LATER_TEST_USE_TEST_DB`` (``LaterDb.worker_env``). The ``later_db`` fixture
marks its tests transactional on every database, so what the test, the live
server and the workers write is committed and seen by the others; LATER's
settings, overridden by the test's ``settings`` fixture, are process-wide and
reach the live server's threads too.

The sync API and Django's async guard
-------------------------------------
Playwright's sync API runs an asyncio event loop in a greenlet of the main
thread, and the loop stays "running" for that thread while the test's code
runs: every Django database call of the test (and of fixtures such as
``later_db``) would raise SynchronousOnlyOperation ("You cannot call this from
an async context"). The ``browser`` fixture sets DJANGO_ALLOW_ASYNC_UNSAFE
while Playwright runs, one module at a time, and stops Playwright at the end
of the module, so the loop is gone before other modules' tests (some call
``asyncio.run``) start. No coroutine of Django runs on that loop: the guard
protects nothing here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers import PROJECT_DIR

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

CHROMIUM = os.environ.get("LATER_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS_DIR = Path(os.environ.get("LATER_TEST_ARTIFACTS") or PROJECT_DIR / "tests" / "artifacts")
VIEWPORT = {"width": 1280, "height": 800}
TIMEOUT_MS = 10_000  # Playwright's default wait for an action or an expect()
PASSWORD = "later-browser-tests"


def _unavailable(reason: str) -> None:
    """Skip, or fail under CI=true: a green CI run always ran the browser tests."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A headless chromium for one test module (see the module docstring)."""
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (the 'test' extra)")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    expect.set_options(timeout=TIMEOUT_MS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
        with sync_playwright() as playwright:
            # --no-sandbox: chromium's sandbox refuses to run as root.
            launched = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            try:
                yield launched
            finally:
                launched.close()


@pytest.fixture(scope="module")
def browser_context(browser: Browser) -> Iterator[BrowserContext]:
    """One context for a module's tests: its HTTP cache keeps the admin's
    static files between tests (a fresh context's first page costs most of
    a second); the ``page`` fixture clears what would leak from a test."""
    context = browser.new_context(viewport=VIEWPORT, color_scheme="light")
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def page(browser_context: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A new page, with no cookies and no local storage (the admin's theme is
    "auto": light); a failed test leaves a screenshot of it in the artifacts."""
    opened = browser_context.new_page()
    try:
        yield opened
    finally:
        report = getattr(request.node, "later_call_report", None)
        if not opened.is_closed():
            if report is not None and report.failed:
                screenshot(opened, f"FAILED-{request.node.name}")
            if opened.url.startswith("http"):
                opened.evaluate("window.localStorage.clear()")
            opened.close()
        browser_context.clear_cookies()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep the call phase's report on the item, for the ``page`` fixture."""
    report = yield
    if report.when == "call":
        item.later_call_report = report  # type: ignore[attr-defined]
    return report


# -- the admin ---------------------------------------------------------------------
@dataclass(frozen=True)
class Staff:
    username: str
    password: str


def create_staff(
    settings: Any,
    username: str = "staff",
    *,
    permissions: tuple[str, ...] = (),
    superuser: bool = False,
) -> Staff:
    """Create a staff user with these permissions ("app_label.codename").

    Passwords are hashed with MD5 for the test (``settings`` is pytest-django's
    fixture): the default hasher costs most of a second per hash.
    """
    from django.contrib.auth.models import Permission, User

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user = User.objects.create_user(
        username, password=PASSWORD, is_staff=True, is_superuser=superuser
    )
    for name in permissions:
        app_label, codename = name.split(".", 1)
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return Staff(username, PASSWORD)


def admin_login(page: Page, base_url: str, staff: Staff, next_path: str = "/admin/") -> None:
    """Log ``staff`` in through the admin's login form; land on ``next_path``."""
    from playwright.sync_api import expect

    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.fill("#id_username", staff.username)
    page.fill("#id_password", staff.password)
    page.click("#login-form [type=submit]")
    expect(page).to_have_url(f"{base_url}{next_path}")


def force_login(page: Page, base_url: str, staff: Staff) -> None:
    """Log ``staff`` in without the login form: a session made by Django's
    test client, its cookie given to the page's context (faster than
    ``admin_login`` when the test is not about logging in)."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username=staff.username))
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    page.context.add_cookies(
        [{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": base_url}]
    )


def use_theme(page: Page, theme: str) -> None:
    """Open the page's next documents in the admin's ``theme`` ("light",
    "dark" or "auto"): the admin's theme toggle keeps it in localStorage."""
    page.add_init_script(f"window.localStorage.setItem('theme', {theme!r});")
    page.emulate_media(color_scheme="dark" if theme == "dark" else "light")


def screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """Save a PNG of the page as ``<artifacts>/<name>.png``; return its path."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS_DIR / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name).strip('-')}.png"
    page.screenshot(path=str(path), full_page=full_page, animations="disabled")
    return path
