"""LATER["CONTEXT"] targets for the system-check tests."""

from __future__ import annotations

NOT_CALLABLE = {"mail_api_url": "http://localhost:8025"}


def build() -> dict[str, str]:
    return dict(NOT_CALLABLE)
