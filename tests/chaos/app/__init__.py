"""The chaos run's Django app: payload types and handlers that record every run."""

from __future__ import annotations
