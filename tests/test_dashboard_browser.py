"""The admin dashboard in a real browser, on SQLite and PostgreSQL.

Chromium (tests/browser.py) drives pytest-django's live server while
``later_worker`` processes run the jobs; the live server, the workers and the
test share the test database (see tests/browser.py). Screenshots of every page,
in the light and the dark theme, are saved as artifacts.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser import admin_login, create_staff

# A real browser and real processes: Django's version changes nothing (tox.ini).
pytestmark = pytest.mark.one_env


def test_staff_logs_into_the_admin(later_db, live_server, page, settings):
    """The chain works: the live server's login page renders in chromium, and
    a staff user's login lands on the admin index."""
    staff = create_staff(settings)
    page.goto(f"{live_server.url}/admin/")
    expect(page).to_have_url(f"{live_server.url}/admin/login/?next=/admin/")
    expect(page.locator("#login-form")).to_be_visible()
    admin_login(page, live_server.url, staff)
    expect(page.locator("#user-tools")).to_contain_text(staff.username)
    expect(page.locator("#site-name")).to_have_text("Django administration")
