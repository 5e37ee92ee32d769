"""A module that exists but fails to import, as a jobs module with a bad import does."""

from __future__ import annotations

from tests.jobapp.no_such_module import something  # type: ignore[import-not-found]  # noqa: F401


def build() -> None:
    return None
