"""The documentation site, built by Sphinx as CI builds it, and read in
chromium: the home page, the tutorial and the API reference render (their
screenshots go to the artifacts), the sidebar's links lead to pages, and no
internal link or anchor of any page is broken."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlparse

import pytest
from playwright.sync_api import Page, expect

from tests.browser import screenshot
from tests.helpers import PROJECT_DIR

# A build and a browser: Django's version changes nothing (tox.ini).
pytestmark = [pytest.mark.slow, pytest.mark.one_env]

DOCS = PROJECT_DIR / "docs"
# What a page shows when Sphinx or MyST could not render something: a
# directive printed as text, an unresolved reference, a system message.
BROKEN = (".. auto", ".. py:", "```{", "{eval-rst}", "Unknown directive", "ERROR/")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built with warnings as errors, as ``./dev docs`` does."""
    try:
        import sphinx  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("sphinx is not installed (the 'docs' extra)")
        pytest.skip("sphinx is not installed (the 'docs' extra)")
    out = tmp_path_factory.mktemp("site") / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, out],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """The built site served over HTTP, as a host would serve it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def assert_rendered(page: Page) -> None:
    """Nothing on the page is Sphinx's or MyST's failure to render."""
    text = page.locator("article").inner_text()
    for marker in BROKEN:
        assert marker not in text, f"{page.url} shows {marker!r}"
    expect(page.locator(".problematic, .system-message")).to_have_count(0)


def test_docs_site_home_lists_every_section_and_its_sidebar_links_resolve(base_url, page):
    page.goto(f"{base_url}/index.html")
    expect(page).to_have_title("later_django")
    expect(page.get_by_role("heading", level=1, name="later_django")).to_be_visible()
    sidebar = page.locator(".sidebar-tree")
    for caption in ("Tutorial", "Guides", "Project"):
        expect(sidebar.locator(".caption-text", has_text=caption)).to_have_count(1)
    for section in ("Tutorial: your first job", "How-to guides", "Reference", "Explanation"):
        expect(sidebar.get_by_role("link", name=section, exact=True)).to_be_visible()
    assert_rendered(page)
    screenshot(page, "docs-home")

    hrefs = sidebar.locator("a.reference").evaluate_all("links => links.map(a => a.href)")
    assert len(hrefs) >= 10
    for href in hrefs:
        response = page.request.get(href)
        assert response.status == 200, href
        assert "<article" in response.text(), href


def test_docs_site_tutorial_renders_its_code(base_url, page):
    page.goto(f"{base_url}/index.html")
    page.locator(".sidebar-tree").get_by_role("link", name="Tutorial: your first job").click()
    expect(page).to_have_url(f"{base_url}/tutorial/index.html")
    expect(page.get_by_role("heading", level=1, name="Tutorial: your first job")).to_be_visible()
    expect(page.get_by_role("heading", level=2, name="Enqueue from a view")).to_be_visible()
    # Highlighted by Pygments: a keyword of the view is a token of its own.
    view = page.locator("div.highlight-python", has_text="transaction.atomic()").first
    expect(view.locator("span.k", has_text="with")).to_have_count(1)
    expect(page.locator("div.highlight-console")).not_to_have_count(0)
    next_link = page.locator(".related-pages a.next-page")
    expect(next_link).to_contain_text("retries, delays and schedules")
    assert_rendered(page)
    screenshot(page, "docs-tutorial")


def test_docs_site_api_reference_renders_docstrings(base_url, page):
    page.goto(f"{base_url}/reference/api.html")
    expect(page.get_by_role("heading", level=1, name="API")).to_be_visible()
    enqueue = page.locator('dt.sig[id="later_django.enqueue"]')
    expect(enqueue).to_contain_text("enqueue(payload")
    expect(page.locator('dt[id="later_django.enqueue"] + dd')).to_contain_text(
        "Enqueue payload; return its id."
    )
    expect(page.locator('dt.sig[id="later_django.job"]')).not_to_have_count(0)
    expect(page.locator('dt.sig[id="later_django.NotMigrated"]')).to_contain_text("exception")
    assert_rendered(page)
    screenshot(page, "docs-reference-api", full_page=False)


def test_docs_site_dashboard_guide_shows_its_screenshots(base_url, page):
    page.goto(f"{base_url}/how-to/dashboard.html")
    images = page.locator("article img")
    expect(images).not_to_have_count(0)
    widths = images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert all(widths), f"images that did not load: {widths}"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # The architecture picture is an SVG whose elements and links carry
        # namespace prefixes (ns0:a, ns1:href): read them without.
        tag = tag.rpartition(":")[2]
        values = {name.rpartition(":")[2]: value for name, value in attrs}
        if values.get("id"):
            self.ids.add(values["id"] or "")
        for name in ("href", "src"):
            if tag in ("a", "img", "link", "script") and values.get(name):
                self.targets.append(values[name] or "")


def parse(path: Path) -> _Links:
    links = _Links()
    links.feed(path.read_text())
    return links


def test_docs_site_has_no_broken_internal_link(site):
    """Every relative link of every page (and of the architecture picture's
    boxes) leads to a file of the site, and a link to a section leads to an
    element with that id."""
    pages = {path: parse(path) for path in site.rglob("*.html")}
    assert len(pages) > 30
    pictures = {path: parse(path) for path in site.glob("_images/graphviz-*.svg")}
    assert any(
        "architecture.html#file-db-hot" in target
        for links in pictures.values()
        for target in links.targets
    ), "the architecture picture is missing, or its boxes lost their links"
    pages.update(pictures)
    broken = []
    for path, links in pages.items():
        for target in links.targets:
            if urlparse(target).scheme or target.startswith(("//", "mailto:")):
                continue
            url, fragment = urldefrag(target)
            file = urlparse(url).path  # without the ?v= of static files
            resolved = Path(unquote(urlparse(urljoin(path.as_uri(), file)).path)) if file else path
            if not resolved.exists():
                broken.append(f"{path.relative_to(site)}: {target}")
            elif fragment and resolved.suffix == ".html":
                ids = (pages.get(resolved) or parse(resolved)).ids
                if unquote(fragment) not in ids:
                    broken.append(f"{path.relative_to(site)}: {target} (no such anchor)")
    assert not broken, "\n".join(broken)
