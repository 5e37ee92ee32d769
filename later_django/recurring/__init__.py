"""Recurring jobs: cron schedules that enqueue one job per occurrence."""
