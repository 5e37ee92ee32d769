"""System checks refuse every bad LATER setting with an ID that names the key."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.checks import Error, Warning, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from later_django.checks import check_settings
from later_django.conf import TIMING_KEYS
from later_django.retry import RetryPolicy
from tests.helpers import PROJECT_DIR, WORKER_ARGS, set_later


def later_messages():  # type: ignore[no-untyped-def]
    """The later.* messages of a full system-check run."""
    return [m for m in run_checks() if str(m.id).startswith("later.")]


def test_checks_pass_on_good_settings():
    """The test settings produce no later message, and manage.py check passes."""
    assert later_messages() == []
    out = StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()


def test_checks_pass_on_a_full_valid_configuration(settings):
    """Every key set to a valid non-default value is accepted."""
    set_later(
        settings,
        NAMESPACE="shop",
        WORKERS=255,
        AUTOSCALE=(1, 255),
        DEFAULT_RETRY_COUNT=0,
        DEFAULT_RETRY_POLICY=RetryPolicy.fixed(3, timedelta(seconds=5)),
        TOPICS={"orders": 8, "a.b-c_D9": 1},
        RECURRING_SEQUENTIAL_PARTITIONS=4,
        VACUUM_INTERVAL=timedelta(hours=1),
        MAX_PAYLOAD_BYTES=1,
        LEASE_DURATION=timedelta(seconds=5),
    )
    assert later_messages() == []


# (overrides, expected id, text the message must contain)
BAD_SETTINGS = [
    ({"WORKERS": 0}, "later.E002", "LATER['WORKERS']"),
    ({"WORKERS": 256}, "later.E002", "LATER['WORKERS']"),
    ({"WORKERS": "6"}, "later.E002", "LATER['WORKERS']"),
    ({"WORKERS": True}, "later.E002", "LATER['WORKERS']"),
    ({"AUTOSCALE": (5, 2)}, "later.E003", "LATER['AUTOSCALE']"),
    ({"AUTOSCALE": (0, 4)}, "later.E003", "LATER['AUTOSCALE']"),
    ({"AUTOSCALE": (2, 300)}, "later.E003", "LATER['AUTOSCALE']"),
    ({"AUTOSCALE": 4}, "later.E003", "LATER['AUTOSCALE']"),
    ({"AUTOSCALE": (1, 2, 3)}, "later.E003", "LATER['AUTOSCALE']"),
    ({"DATABASE": "nowhere"}, "later.E004", "LATER['DATABASE']"),
    ({"NAMESPACE": ""}, "later.E006", "LATER['NAMESPACE']"),
    ({"NAMESPACE": "n" * 65}, "later.E006", "LATER['NAMESPACE']"),
    ({"TOPICS": ["orders"]}, "later.E007", "LATER['TOPICS']"),
    ({"TOPICS": {"": 4}}, "later.E008", "LATER['TOPICS']"),
    ({"TOPICS": {"has space": 4}}, "later.E008", "'has space'"),
    ({"TOPICS": {"t" * 101: 4}}, "later.E008", "LATER['TOPICS']"),
    ({"TOPICS": {7: 4}}, "later.E008", "LATER['TOPICS']"),
    ({"TOPICS": {"orders": 0}}, "later.E009", "LATER['TOPICS']['orders']"),
    ({"TOPICS": {"orders": -1}}, "later.E009", "LATER['TOPICS']['orders']"),
    ({"TOPICS": {"orders": "8"}}, "later.E009", "LATER['TOPICS']['orders']"),
    ({"DEFAULT_RETRY_COUNT": -1}, "later.E011", "LATER['DEFAULT_RETRY_COUNT']"),
    ({"DEFAULT_RETRY_POLICY": 3}, "later.E012", "LATER['DEFAULT_RETRY_POLICY']"),
    ({"MAX_PAYLOAD_BYTES": 0}, "later.E013", "LATER['MAX_PAYLOAD_BYTES']"),
    (
        {"RECURRING_SEQUENTIAL_PARTITIONS": 0},
        "later.E014",
        "LATER['RECURRING_SEQUENTIAL_PARTITIONS']",
    ),
    ({"PREPARED_STATEMENTS": "yes"}, "later.E016", "LATER['PREPARED_STATEMENTS']"),
    ({"CONTEXT": "tests.jobapp.nowhere.build"}, "later.E017", "LATER['CONTEXT']"),
    ({"CONTEXT": "tests.jobapp.context.nothing"}, "later.E017", "LATER['CONTEXT']"),
    ({"CONTEXT": "build"}, "later.E017", "LATER['CONTEXT']"),
    ({"CONTEXT": "tests.jobapp.context.NOT_CALLABLE"}, "later.E018", "LATER['CONTEXT']"),
    ({"CONTEXT": 5}, "later.E018", "LATER['CONTEXT']"),
    ({"JOBS_MODULE": "shop/jobs"}, "later.E019", "LATER['JOBS_MODULE']"),
    ({"JOBS_MODULE": ""}, "later.E019", "LATER['JOBS_MODULE']"),
    ({"JOBS_MODULE": None}, "later.E019", "LATER['JOBS_MODULE']"),
    ({"TRACING": "on"}, "later.E020", "LATER['TRACING']"),
]


@pytest.mark.parametrize(
    ("overrides", "check_id", "names"),
    BAD_SETTINGS,
    ids=[f"{cid}-{next(iter(o))}={next(iter(o.values()))!r}"[:60] for o, cid, _ in BAD_SETTINGS],
)
def test_checks_report_each_bad_setting(settings, overrides, check_id, names):
    """A bad value gives exactly its error ID, a message naming the key, and a hint."""
    set_later(settings, **overrides)
    messages = later_messages()
    assert [m.id for m in messages] == [check_id]
    assert isinstance(messages[0], Error)
    assert names in messages[0].msg
    assert messages[0].hint


@pytest.mark.parametrize("key", sorted(TIMING_KEYS))
@pytest.mark.parametrize("value", [30, timedelta(0), timedelta(seconds=-1)], ids=repr)
def test_checks_report_non_timedelta_timings(settings, key, value):
    """Each timing key must be a positive timedelta (later.E010, naming the key)."""
    set_later(settings, **{key: value})
    messages = later_messages()
    assert [m.id for m in messages] == ["later.E010"]
    assert f"LATER[{key!r}]" in messages[0].msg
    assert "timedelta" in messages[0].msg


def test_checks_report_each_of_several_bad_settings(settings):
    """Several bad keys give one error each, not just the first."""
    set_later(settings, WORKERS=0, AUTOSCALE=(9, 3), TOPICS={"": 0})
    assert sorted(m.id for m in later_messages()) == [
        "later.E002",
        "later.E003",
        "later.E008",
        "later.E009",
    ]


def test_checks_refuse_a_later_setting_that_is_not_a_dict(settings):
    """LATER must be a dict (later.E001)."""
    settings.LATER = [("WORKERS", 6)]
    assert [m.id for m in later_messages()] == ["later.E001"]


def test_checks_warn_about_unknown_keys(settings):
    """A misspelt key is a warning naming it (later.W001)."""
    set_later(settings, WORKER=6)
    messages = later_messages()
    assert [m.id for m in messages] == ["later.W001"]
    assert isinstance(messages[0], Warning)
    assert "WORKER" in messages[0].msg


def test_checks_suggest_the_nearest_key_for_a_misspelt_one(settings):
    """W001's hint names the known key closest to a misspelt one."""
    set_later(settings, WORKRES=6)
    (message,) = later_messages()
    assert message.id == "later.W001"
    assert message.msg == "LATER has unknown keys: WORKRES."
    assert message.hint == (
        "Did you mean WORKERS? Otherwise remove it; see docs/reference/settings.md."
    )


def test_checks_suggest_a_key_for_each_misspelt_one(settings):
    """With several unknown keys, each close one gets its suggestion, in
    upper case even when the key was lower case, and a wholly unknown one
    gets none."""
    set_later(settings, TOPIC={}, workers=6, FROBNICATE=1)
    (message,) = later_messages()
    assert message.msg == "LATER has unknown keys: FROBNICATE, TOPIC, workers."
    assert message.hint == (
        "Did you mean TOPICS (for TOPIC), WORKERS (for workers)? Otherwise remove "
        "them or fix their spelling; see docs/reference/settings.md."
    )


def test_checks_suggest_nothing_for_a_wholly_unknown_key(settings):
    """A key like no known one gets no suggestion."""
    set_later(settings, FROBNICATE=1)
    (message,) = later_messages()
    assert message.id == "later.W001"
    assert message.hint == "Remove it or fix its spelling; see docs/reference/settings.md."
    assert "did you mean" not in message.hint.lower()


def test_checks_name_a_key_that_is_not_a_string(settings):
    """LATER = {1: 2} is named in W001, not a crash of the check."""
    settings.LATER = {**settings.LATER, 1: 2}
    (message,) = later_messages()
    assert message.id == "later.W001"
    assert message.msg == "LATER has unknown keys: 1."


def test_checks_unknown_database_lists_the_aliases(settings):
    """The E004 hint names the aliases that do exist."""
    set_later(settings, DATABASE="nowhere")
    (message,) = later_messages()
    assert "'nowhere'" in message.msg
    assert "default" in message.hint


def test_checks_report_an_unhashable_database_alias(settings):
    """A list as LATER['DATABASE'] is reported as later.E004, not a crash."""
    set_later(settings, DATABASE=["default"])
    ids = [message.id for message in check_settings()]
    assert "later.E004" in ids


def test_checks_fail_manage_py_check_on_bad_settings(settings):
    """manage.py check stops on a bad setting and prints its ID."""
    set_later(settings, WORKERS=0)
    with pytest.raises(SystemCheckError, match=r"later\.E002"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


def test_checks_accept_a_context_factory_by_path_or_as_a_callable(settings):
    """A dotted path to a callable, or the callable itself, is accepted."""
    from tests.jobapp.context import build

    for value in ("tests.jobapp.context.build", build, None):
        set_later(settings, CONTEXT=value)
        assert later_messages() == [], value


def test_checks_context_messages_name_the_value_and_the_cause(settings):
    """E017 names the path and the import error; E018 what the path points at."""
    set_later(settings, CONTEXT="tests.jobapp.nowhere.build")
    (message,) = later_messages()
    assert message.msg == (
        "LATER['CONTEXT'] is 'tests.jobapp.nowhere.build', which does not import: "
        "ModuleNotFoundError: No module named 'tests.jobapp.nowhere'."
    )
    assert "zero" in message.hint or "no arguments" in message.hint
    set_later(settings, CONTEXT="tests.jobapp.context.NOT_CALLABLE")
    (message,) = later_messages()
    assert message.msg == (
        "LATER['CONTEXT'] is 'tests.jobapp.context.NOT_CALLABLE', which is a dict, not a callable."
    )


def test_checks_report_an_import_error_inside_the_context_module(settings):
    """A module that exists but fails to import is reported with its own error,
    not as a missing module of the CONTEXT path."""
    set_later(settings, CONTEXT="tests.jobapp.broken_jobs.build")
    (message,) = later_messages()
    assert message.id == "later.E017"
    assert "No module named 'tests.jobapp.no_such_module'" in message.msg


def test_checks_warn_when_no_installed_app_has_the_jobs_module(settings):
    """A JOBS_MODULE set to a name no app has is a warning (later.W004); the
    default, or a name some app has, is not."""
    for name in ("job", "jobs.py", "jobapp.jobs", "tests.jobapp.jobs"):
        set_later(settings, JOBS_MODULE=name)
        messages = later_messages()
        assert [m.id for m in messages] == ["later.W004"], name
        assert isinstance(messages[0], Warning)
        assert f"LATER['JOBS_MODULE'] is {name!r}" in messages[0].msg
    set_later(settings, JOBS_MODULE="jobs")
    assert later_messages() == []


def test_checks_fail_manage_py_check_on_a_bad_context(settings):
    """manage.py check stops on a CONTEXT that does not import."""
    set_later(settings, CONTEXT="tests.jobapp.nowhere.build")
    with pytest.raises(SystemCheckError, match=r"later\.E017"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


def test_checks_stop_later_worker_on_a_bad_context(tmp_path: Path):
    """later_worker stops at the check, before it touches the database, instead
    of crashing with a bare ModuleNotFoundError."""
    never = tmp_path / "never.sqlite3"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "LATER_TEST_SETTINGS": json.dumps({"CONTEXT": "tests.jobapp.nowhere.build"}),
        "LATER_TEST_DB_OVERRIDE": json.dumps({"NAME": str(never)}),
    }
    result = subprocess.run(
        WORKER_ARGS,
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "later.E017" in result.stderr
    assert "Traceback" not in result.stderr
    assert not never.exists()
