"""The dashboard's pages and JSON endpoints, served inside an admin site.

Every view runs behind the site's ``admin_view`` (staff only: others go to
the admin login; CSRF on POST) and then checks the permission:
``later_django.view_dashboard`` to look, ``later_django.change_job`` as
well to act. No response carries a payload's bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from later_django import registry
from later_django.dashboard import actions, filters, reads
from later_django.db.rows.dashboard import RECENT
from later_django.ids import ULID_LENGTH
from later_django.partitions.reserved import registered_topics
from later_django.queues import declared as declared_queues

VIEW_PERMISSION = "later_django.view_dashboard"
CHANGE_PERMISSION = "later_django.change_job"
NAMESPACE = "later_dashboard"

View = Callable[..., HttpResponse]


def _viewer(request: HttpRequest) -> None:
    if not request.user.has_perm(VIEW_PERMISSION):
        raise PermissionDenied(f"the dashboard needs the permission {VIEW_PERMISSION}")


class Dashboard:
    """The views, bound to the admin site whose look and login they use."""

    def __init__(self, site: AdminSite) -> None:
        self.site = site

    def urls(self) -> list[Any]:
        wrap = self.site.admin_view
        pages: list[tuple[str, View, str]] = [
            ("", self.overview, "overview"),
            ("jobs/", self.jobs, "jobs"),
            ("jobs/<str:job_id>/", self.job, "job"),
            ("topics/", self.topics, "topics"),
            ("queues/", self.queues, "queues"),
            ("queues/actions/", self.queue_action, "queue_action"),
            ("recurring/", self.recurring, "recurring"),
            ("actions/", self.action, "action"),
            ("api/overview", self.api_overview, "api_overview"),
            ("api/samples", self.api_samples, "api_samples"),
            ("api/jobs", self.api_jobs, "api_jobs"),
            ("api/jobs/<str:job_id>", self.api_job, "api_job"),
            ("api/topics", self.api_topics, "api_topics"),
            ("api/queues", self.api_queues, "api_queues"),
            ("api/recurring", self.api_recurring, "api_recurring"),
        ]
        return [path(route, wrap(view), name=f"{NAMESPACE}_{name}") for route, view, name in pages]

    def _reverse(self, name: str, *args: str) -> str:
        """The URL of the dashboard's view ``name`` on this site, whatever
        name and prefix the site has (as the admin reverses its own URLs)."""
        return reverse(f"admin:{NAMESPACE}_{name}", args=args, current_app=self.site.name)

    def _with_urls(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each job with its page's URL: reversed once a page, not once a row."""
        placeholder = "0" * ULID_LENGTH
        pattern = self._reverse("job", placeholder)
        for job in jobs:
            job["url"] = pattern.replace(placeholder, job["id"])
        return jobs

    def _render(
        self, request: HttpRequest, template: str, title: str, **context: Any
    ) -> HttpResponse:
        # The templates' {% url 'admin:...' %} then resolve on this site.
        request.current_app = self.site.name
        return TemplateResponse(
            request,
            f"later_django/dashboard/{template}",
            {
                **self.site.each_context(request),
                "title": title,
                "can_change": request.user.has_perm(CHANGE_PERMISSION),
                **context,
            },
        )

    # -- pages --------------------------------------------------------------------------
    def overview(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        overview = reads.overview()
        return self._render(
            request,
            "overview.html",
            "Dashboard",
            tab="overview",
            overview=overview,
            wait_rows=[
                ("regular", "Plain", overview["waits"]["regular"] or {}),
                ("partitioned", "Partitioned", overview["waits"]["partitioned"] or {}),
            ],
            sample_ranges=list(reads.SAMPLE_RANGES),
        )

    def jobs(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        try:
            query = filters.query_from(request.GET)
        except ValueError as exc:
            return HttpResponseBadRequest(str(exc))
        if query.id_prefix is not None and len(query.id_prefix) == ULID_LENGTH:
            return HttpResponseRedirect(self._reverse("job", query.id_prefix))
        try:
            page = reads.job_page(query)
        except ValueError as exc:  # a cursor that does not fit the list
            return HttpResponseBadRequest(str(exc))
        stage_counts = reads.counts()
        # Every job is in the recent list.
        counts = {RECENT: sum(stage_counts.values()), **stage_counts}
        return self._render(
            request,
            "jobs.html",
            "Job list",
            tab="jobs",
            query=query,
            page=page,
            jobs=self._with_urls([reads.summary_dict(j) for j in page.jobs]),
            next_query=filters.query_string(query, after=reads.page_dict(page)["next"])
            if page.after
            else None,
            filter_query=filters.query_string(query),
            filter_fields=filters.fields_of(query),
            stage_links=[
                (stage, filters.query_string(query, stage=stage, q=None), counts.get(stage, 0))
                for stage in filters.LISTS
            ],
            types=registry.registered_names(),
            topic_names=sorted(registered_topics()),
            queue_names=declared_queues(),
            page_size=query.page_size,
            scan_limit=query.scan_limit,
            actions=_actions_for(
                None if query.stage == RECENT else query.stage,
                partition_job=query.topic is not None,
            ),
            # The recent list's filter holds every job: no action on all of them.
            bulk=query.stage != RECENT,
        )

    def job(self, request: HttpRequest, job_id: str) -> HttpResponse:
        _viewer(request)
        job = reads.job_detail(job_id.lower())
        if job is None:
            raise Http404(f"no job {job_id} (finished jobs are deleted after DASHBOARD_RETENTION)")
        return self._render(
            request,
            "job.html",
            f"Job {job['id']}",
            tab="jobs",
            job=job,
            actions=_actions_for(job["stage"], partition_job=job["topic"] is not None),
        )

    def topics(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._render(request, "topics.html", "Topics", tab="topics", data=reads.topics())

    def queues(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._render(request, "queues.html", "Queues", tab="queues", data=reads.queues())

    def recurring(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._render(
            request, "recurring.html", "Recurring jobs", tab="recurring", data=reads.recurring()
        )

    # -- actions -------------------------------------------------------------------------
    def _back(self, request: HttpRequest, default: str = "overview") -> str:
        target = request.POST.get("next") or ""
        if url_has_allowed_host_and_scheme(
            target, {request.get_host()}, require_https=request.is_secure()
        ):
            return target
        return self._reverse(default)

    def action(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        _viewer(request)
        if not request.user.has_perm(CHANGE_PERMISSION):
            raise PermissionDenied(f"actions on jobs need the permission {CHANGE_PERMISSION}")
        action = request.POST.get("action", "")
        if action not in actions.ACTIONS:
            return HttpResponseBadRequest(
                f"unknown action {action!r}: use one of {', '.join(actions.ACTIONS)}"
            )
        if request.POST.get("all_matching"):
            try:
                query = filters.query_from(request.POST, with_cursor=False)
            except ValueError as exc:
                return HttpResponseBadRequest(str(exc))
            if query.stage == RECENT:
                return HttpResponseBadRequest(
                    "acting on every matching job needs a stage: pick one in the list's menu"
                )
            if action == "force_fail" and query.topic is None:
                return HttpResponseBadRequest(
                    "force-failing every matching job needs a topic filter: the heads "
                    "of that topic's partitions are failed"
                )
            if not request.POST.get("confirm"):
                return self._render(
                    request,
                    "confirm.html",
                    "Are you sure?",
                    action=action,
                    verb=actions.ACTIONS[action],
                    query=query,
                    fields=dict(filters.fields_of(query)),
                    back=self._back(request),
                )
            result = actions.apply_matching(action, query)
        else:
            ids = [i.strip().lower() for i in request.POST.getlist("job") if i.strip()]
            if not ids:
                messages.warning(request, "No job was selected: tick the jobs to act on.")
                return HttpResponseRedirect(self._back(request))
            result = actions.apply(action, ids)
        level = messages.SUCCESS if result.done else messages.WARNING
        messages.add_message(request, level, result.message())
        return HttpResponseRedirect(self._back(request))

    def queue_action(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume the queue ``queue`` on every server; a queue that
        is already in that state (a stale page) is left as it is, and the
        message says so."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        _viewer(request)
        if not request.user.has_perm(CHANGE_PERMISSION):
            raise PermissionDenied(
                f"pausing and resuming queues needs the permission {CHANGE_PERMISSION}"
            )
        action = request.POST.get("action", "")
        if action not in actions.QUEUE_ACTIONS:
            return HttpResponseBadRequest(
                f"unknown action {action!r}: use one of {', '.join(actions.QUEUE_ACTIONS)}"
            )
        try:
            result = actions.apply_to_queue(action, request.POST.get("queue", ""))
        except ValueError as exc:  # not a queue declared in LATER["QUEUES"]
            return HttpResponseBadRequest(str(exc))
        level = messages.SUCCESS if result.changed else messages.WARNING
        messages.add_message(request, level, result.message())
        return HttpResponseRedirect(self._back(request, "queues"))

    # -- JSON --------------------------------------------------------------------------------
    @staticmethod
    def _json(data: dict[str, Any]) -> JsonResponse:
        return JsonResponse(data, json_dumps_params={"separators": (",", ":")})

    def api_overview(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._json(reads.overview())

    def api_samples(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        range_name = request.GET.get("range", "24h")
        if range_name not in reads.SAMPLE_RANGES:
            return _json_error(
                f"unknown range {range_name!r}: use one of {', '.join(reads.SAMPLE_RANGES)}"
            )
        return self._json(reads.samples(range_name))

    def api_jobs(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        try:
            query = filters.query_from(request.GET)
            page = reads.job_page(query)
        except ValueError as exc:
            return _json_error(str(exc))
        return self._json(reads.page_dict(page))

    def api_job(self, request: HttpRequest, job_id: str) -> HttpResponse:
        _viewer(request)
        job = reads.job_detail(job_id.lower())
        if job is None:
            return JsonResponse({"error": f"no job {job_id}"}, status=404)
        return self._json(job)

    def api_topics(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._json(reads.topics())

    def api_queues(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._json(reads.queues())

    def api_recurring(self, request: HttpRequest) -> HttpResponse:
        _viewer(request)
        return self._json(reads.recurring())


def _json_error(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


def _actions_for(stage: str | None, *, partition_job: bool = False) -> list[tuple[str, str]]:
    """The actions that apply to jobs of ``stage`` (None: a list of several
    stages): (action, button label)."""
    found = []
    if stage == "failed" and not partition_job:
        found.append(("retry", "Retry"))
    if stage in ("delayed", "requeued"):
        found.append(("run_now", "Run now"))
    if stage in (None, "enqueued", "delayed", "waiting", "requeued"):
        found.append(("cancel", "Cancel"))
    if partition_job and stage in (None, "enqueued", "delayed", "waiting", "requeued", "running"):
        found.append(("force_fail", "Force-fail partition head"))
    return found
