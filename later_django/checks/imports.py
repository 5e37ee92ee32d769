"""Checks of the import paths LATER names: the CONTEXT factory and the
jobs module every installed app may have.
"""

from __future__ import annotations

from django.apps import apps
from django.core.checks import CheckMessage, Warning
from django.utils.module_loading import import_string, module_has_submodule

from later_django.checks.messages import error
from later_django.registry import is_module_name


def check_context(path: object) -> list[CheckMessage]:
    hint = (
        "Set LATER['CONTEXT'] to the dotted path of a function that takes no "
        "arguments, e.g. 'shop.context.build', or None."
    )
    if path is None:
        return []
    if not isinstance(path, str):
        if callable(path):
            return []
        return [error("E018", f"LATER['CONTEXT'] is {path!r}; it must be a dotted path.", hint)]
    try:
        factory = import_string(path)
    except Exception as exc:  # noqa: BLE001  any error of the user's module is reported
        return [
            error(
                "E017",
                f"LATER['CONTEXT'] is {path!r}, which does not import: "
                f"{type(exc).__name__}: {exc}.",
                hint,
            )
        ]
    if not callable(factory):
        return [
            error(
                "E018",
                f"LATER['CONTEXT'] is {path!r}, which is a {type(factory).__name__}, "
                "not a callable.",
                hint,
            )
        ]
    return []


def check_jobs_module(name: object, *, explicit: bool) -> list[CheckMessage]:
    if not is_module_name(name):
        return [
            error(
                "E019",
                f"LATER['JOBS_MODULE'] is {name!r}; it must be a module name such as 'jobs'.",
                "Set it to the name of the module later imports from every installed "
                "app: 'jobs' for shop/jobs.py.",
            )
        ]
    # An app without the module is fine (like admin.py), but a name no app
    # has is a mistake. (An import error already stopped AppConfig.ready().)
    if not explicit or any(
        module_has_submodule(app.module, name) for app in apps.get_app_configs()
    ):
        return []
    return [
        Warning(
            f"LATER['JOBS_MODULE'] is {name!r}, but no installed app has a module of "
            "that name, so no handler is registered from it.",
            hint="Give the module's name inside each app ('jobs' for shop/jobs.py), "
            "not a file name or a dotted path from the project; or remove the key "
            "to use 'jobs'.",
            id="later.W004",
        )
    ]
