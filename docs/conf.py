"""Sphinx configuration of later_django's documentation: Markdown pages read by
MyST, the Furo theme, and the API reference from the package's docstrings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import django
from django.conf import settings
from pygments.lexers.special import TextLexer

if TYPE_CHECKING:
    from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# autodoc imports later_django, whose models need a configured Django; no
# database is opened.
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.admin",
        "later_django",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()

project = "later_django"
author = "later_django contributors"
copyright = "later_django contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.graphviz",
]
# The architecture picture (docs/project/architecture.md), drawn at build
# time by Debian's graphviz: an SVG whose boxes are links.
graphviz_output_format = "svg"

source_suffix = {".md": "markdown"}
root_doc = "index"
# What is not a page: the build, the Grafana and Prometheus files that pages
# link to, and the images (served as static files through the pages).
exclude_patterns = ["_build", "grafana", "img"]

myst_enable_extensions = ["colon_fence"]
# Anchors for the ## and ### headings, so a link can name a section
# ([x](settings.md#database)).
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}

html_theme = "furo"
html_title = "later_django"


def setup(app: Sphinx) -> None:
    # The state diagrams are Mermaid source, which GitHub draws; the site
    # shows their text rather than fetch a renderer from elsewhere.
    app.add_lexer("mermaid", TextLexer)
