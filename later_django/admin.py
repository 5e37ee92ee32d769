"""The dashboard in Django admin: an entry in the admin index, and its pages
at ``/admin/later/`` of the default admin site (docs/how-to/dashboard.md; another
admin site adds them with ``later_django.dashboard.urls.for_site`` and its
index entry by registering ``Dashboard`` with ``DashboardAdmin``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from later_django.dashboard.urls import for_site
from later_django.dashboard.views import VIEW_PERMISSION
from later_django.models import Dashboard


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Lists the dashboard in the admin index; its changelist is the dashboard."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return HttpResponseRedirect(
            reverse("admin:later_dashboard_overview", current_app=self.admin_site.name)
        )


def _with_dashboard(site: admin.AdminSite) -> None:
    """Serve the dashboard under the site's ``later/``, before the site's own
    catch-all patterns."""
    site_urls = site.get_urls

    def get_urls() -> list[Any]:
        return [*for_site(site), *site_urls()]

    site.get_urls = get_urls  # type: ignore[method-assign]


_with_dashboard(admin.site)
