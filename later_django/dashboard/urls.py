"""The dashboard's URL patterns for an admin site."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.urls import include, path

from later_django.dashboard.views import Dashboard


def for_site(site: AdminSite) -> list[Any]:
    """``later/...`` patterns for ``site``'s URLconf, named
    ``<site name>:later_dashboard_*``: what later_django/admin.py gives the
    default site. For another admin site::

        class MyAdminSite(AdminSite):
            def get_urls(self):
                return [*for_site(self), *super().get_urls()]

    The pages' links, forms, redirects and JSON URLs are reversed on
    ``site`` (``current_app=site.name``), so they stay within it.
    """
    return [path("later/", include(Dashboard(site).urls()))]
