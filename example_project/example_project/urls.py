from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]
if settings.HAS_PROMETHEUS:
    urlpatterns.append(path("", include("django_prometheus.urls")))  # /metrics
