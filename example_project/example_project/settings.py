"""Settings of the example shop: SQLite by default, PostgreSQL with DATABASE_URL."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "later_django",
    "shop",
]

# later's metrics on /metrics next to Django's own, when the `prometheus`
# extra is installed (pip install "later-django[prometheus]"); workers serve
# theirs with `manage.py later_worker --metrics-port 9100`.
try:
    import django_prometheus  # noqa: F401
except ImportError:
    HAS_PROMETHEUS = False
else:
    HAS_PROMETHEUS = True
    INSTALLED_APPS.append("django_prometheus")

# Django's own @task functions (shop/tasks.py) run on later's workers.
# Django 6.x has django.tasks; Django 5.2 needs the backport (the "tasks" extra).
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
TASKS = {"default": {"BACKEND": "later_django.tasks.LaterBackend"}}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

if os.environ.get("DATABASE_URL"):
    _url = urlsplit(os.environ["DATABASE_URL"])
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _url.path.lstrip("/"),
            "USER": _url.username or "",
            "PASSWORD": _url.password or "",
            "HOST": _url.hostname or "",
            "PORT": str(_url.port or ""),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "shop.sqlite3",
            "OPTIONS": {
                # Writers queue for the lock instead of failing mid-transaction.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

LATER = {
    "WORKERS": 4,
    # Short cadences so the demo's retries and delayed jobs show up quickly.
    "MAINTENANCE_INTERVAL": timedelta(milliseconds=500),
    "DASHBOARD_RETENTION": timedelta(days=1),
    # Sequential partition mode: a customer's ledger lines (shop/jobs.py,
    # LedgerEntry) run one at a time, in order. The count is fixed for good.
    "TOPICS": {"ledger": 4},
    # Named queues (docs/how-to/queues.md): receipts run on "emails" (shop/jobs.py),
    # at most 20 started a second across every worker (docs/how-to/rate-limits.md).
    "QUEUES": {"default": {}, "emails": {"rate_limit": "20/s"}},
    # later_retained_log_consumer_lag for the shop's order events (shop/order_events.py).
    "RETAINED_LOG_LAG": {"order-events": ["analytics"]},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"later_django": {"handlers": ["console"], "level": "WARNING"}},
}
