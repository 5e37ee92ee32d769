"""The shape of every error later's checks report."""

from __future__ import annotations

from django.core.checks import Error


def error(id_: str, msg: str, hint: str) -> Error:
    """A ``later.<id_>`` error: ``msg`` names the key, ``hint`` the fix."""
    return Error(msg, hint=hint, id=f"later.{id_}")
