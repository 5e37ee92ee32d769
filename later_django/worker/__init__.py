"""The worker: ``Server`` runs a supervised pool of job workers in one process."""

from __future__ import annotations

from later_django.worker.server import Server

__all__ = ["Server"]
