"""The release this code is, written on each server's heartbeat row and read
by packaging (pyproject.toml takes its version from here)."""

from __future__ import annotations

__version__ = "0.1.0"
