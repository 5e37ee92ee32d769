"""The reference pages cover the code: every public name has a docstring and
an autodoc entry in docs/reference/, and every setting, check id, management
command option and metric has its entry there; README.md's links lead to
files."""

from __future__ import annotations

import importlib
import inspect
import re
from argparse import ArgumentParser
from types import ModuleType

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

import later_django
from later_django import events
from later_django.conf import DEFAULTS
from tests.helpers import PROJECT_DIR

REFERENCE = PROJECT_DIR / "docs" / "reference"
PACKAGE = PROJECT_DIR / "later_django"
# The modules users import on their own, beside the package (docs/reference/modules.md).
MODULES = [
    "later_django",
    "later_django.testing",
    "later_django.retained_log",
    "later_django.tasks",
    "later_django.worker",
]
AUTODOC = re.compile(r"^\.\. auto(?:function|class|exception|decorator|data)::\s+(\S+)", re.M)


def public_names(module: ModuleType) -> list[str]:
    """``__all__``, or for the events module (which has none) its event
    classes and ``subscribe``."""
    if module is events:
        classes = [
            name
            for name, value in vars(events).items()
            if isinstance(value, type) and issubclass(value, events.Event)
        ]
        return [*classes, "subscribe"]
    return list(module.__all__)


def every_public_name() -> list[tuple[str, str]]:
    modules = [importlib.import_module(name) for name in MODULES] + [events]
    return [(module.__name__, name) for module in modules for name in public_names(module)]


def own_docstring(value: object) -> str:
    """The docstring written for ``value``: not one a class inherits from a
    base (Django's TextChoices has one), nor the signature a dataclass makes
    up when it has none."""
    if isinstance(value, type):
        doc = value.__dict__.get("__doc__") or ""
        return "" if doc.startswith(f"{value.__name__}(") else doc
    return getattr(value, "__doc__", None) or ""


def reference_text(page: str) -> str:
    return (REFERENCE / page).read_text()


def autodoc_targets() -> set[str]:
    return {
        target for page in REFERENCE.glob("*.md") for target in AUTODOC.findall(page.read_text())
    }


def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end != -1 else None]


def test_docs_reference_covers_every_name_of_the_package():
    """The list checked below is the package's ``__all__``, entire."""
    names = {name for module, name in every_public_name() if module == "later_django"}
    assert names == set(later_django.__all__)


@pytest.mark.parametrize(("module", "name"), every_public_name())
def test_docs_reference_public_name_has_a_docstring(module, name):
    value = getattr(importlib.import_module(module), name)
    assert own_docstring(value).strip(), f"{module}.{name} has no docstring"


@pytest.mark.parametrize(("module", "name"), every_public_name())
def test_docs_reference_public_name_has_an_autodoc_entry(module, name):
    assert f"{module}.{name}" in autodoc_targets(), (
        f"{module}.{name} is in no autodoc directive of docs/reference/"
    )


def test_docs_reference_has_every_setting():
    text = reference_text("settings.md")
    missing = [key for key in DEFAULTS if f"\n### `{key}`\n" not in text]
    assert not missing, f"LATER keys missing from docs/reference/settings.md: {missing}"


def test_docs_reference_has_every_check_id():
    """Every id the code can report has its entry; an entry the code no
    longer reports says it is retired."""
    source = "\n".join(path.read_text() for path in PACKAGE.rglob("*.py"))
    in_code = {f"later.{id_}" for id_ in re.findall(r"[\"'](?:later\.)?([EW]\d{3})[\"']", source)}
    text = reference_text("checks.md")
    documented = set(re.findall(r"^### (later\.[EW]\d{3})$", text, re.M))
    assert in_code - documented == set()
    for id_ in documented - in_code:
        assert "Retired" in section(text, f"### {id_}"), f"{id_} is documented but never reported"


def later_commands() -> list[str]:
    folder = PACKAGE / "management" / "commands"
    return sorted(path.stem for path in folder.glob("later_*.py"))


def own_options(parser: ArgumentParser, common: set[str]) -> list[str]:
    """Each argument as the page writes it: its long option, or a
    positional argument's metavar in capitals."""
    options = []
    for action in parser._actions:
        if action.option_strings:
            long = max(action.option_strings, key=len)
            if long not in common:
                options.append(long)
        elif action.dest not in common:
            options.append(action.dest.upper())
    return options


def test_docs_reference_has_every_command():
    assert {"later_consume", "later_migrate", "later_worker"} <= set(later_commands())


@pytest.mark.parametrize("command", later_commands())
def test_docs_reference_has_every_command_option(command):
    """Every option of the command is in the command's section of
    commands.md; Django's common ones are listed once at the top."""
    common_parser = BaseCommand().create_parser("manage.py", "base")
    common = {max(a.option_strings, key=len) for a in common_parser._actions if a.option_strings}
    common |= {"args"}
    parser = load_command_class("later_django", command).create_parser("manage.py", command)
    page = reference_text("commands.md")
    assert f"\n## `{command}`\n" in page, f"docs/reference/commands.md has no section {command}"
    text = section(page, f"## `{command}`")
    missing = [option for option in own_options(parser, common) if f"`{option}" not in text]
    assert not missing, f"{command} options missing from docs/reference/commands.md: {missing}"


def test_docs_reference_has_every_metric():
    """Every family later_django.metrics defines; a counter is exposed with
    ``_total``, as the page writes it."""
    sources = "".join(path.read_text() for path in (PACKAGE / "metrics").glob("*.py"))
    names = set(re.findall(r"\"(later_[a-z_]+)\"", sources))
    assert len(names) > 10  # the scan found the families, not nothing
    text = reference_text("metrics.md")
    missing = [n for n in sorted(names) if f"`{n}`" not in text and f"`{n}_total`" not in text]
    assert not missing, f"metrics missing from docs/reference/metrics.md: {missing}"


def test_docs_reference_checks_its_own_helpers():
    """``own_docstring`` sees through what a class inherits or a dataclass
    makes up, so the docstring test above can fail."""
    from dataclasses import dataclass

    from django.db import models

    @dataclass
    class Plain:
        value: int

    class Choices(models.TextChoices):
        ONE = "one"

    assert own_docstring(Plain) == ""
    assert own_docstring(Choices) == ""
    assert own_docstring(later_django.Stage)
    assert inspect.getdoc(Choices)  # what a naive check would have accepted


def test_docs_readme_links_lead_to_files():
    """README.md's relative links name files of the repository (the site's
    pages are checked when it is built)."""
    text = (PROJECT_DIR / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert len(local) > 10
    missing = [t for t in local if not (PROJECT_DIR / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
