"""SQL of ``later_task_result``: what the Django Tasks backend keeps per task job."""

from __future__ import annotations
