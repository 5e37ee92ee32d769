from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin import AdminSite
from django.urls import path

from later_django.admin import DashboardAdmin
from later_django.dashboard.urls import for_site
from later_django.models import Dashboard


class OpsAdminSite(AdminSite):
    """A project's own admin site, with the dashboard mounted on it."""

    def get_urls(self) -> list[Any]:
        return [*for_site(self), *super().get_urls()]


ops_site = OpsAdminSite(name="ops")
ops_site.register(Dashboard, DashboardAdmin)

urlpatterns = [path("admin/", admin.site.urls), path("ops/", ops_site.urls)]
