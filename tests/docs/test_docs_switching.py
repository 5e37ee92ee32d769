"""The switching guides run as written, and the comparison's figures are measured ones.

docs/how-to/coming-from-celery.md and docs/how-to/coming-from-django-q2.md
show another library's code in ```` ```{code-block} python ```` fences, which
are not run, and later_django's in ```` ```python ```` fences, which
``test_guide_runs_as_written`` runs in a fresh project on SQLite, in a
process of its own, in the page's order:

- The project is the one a reader already has: what ``django-admin
  startproject mysite`` and ``startapp shop`` make, with ``"shop"`` in
  ``INSTALLED_APPS`` and Django's in-memory mail backend.
- A fence whose first line is a comment naming a Python file and nothing else
  (``# shop/jobs.py``) is that file. ``# settings.py`` is appended to the
  project's settings module; any other path is relative to the project's root
  and appended to what is there (startapp's stub, or an earlier fence naming
  the same file). Every file is written before Django starts.
- Every other fence is a snippet, run as ``python manage.py shell`` runs a
  script, after ``later_migrate`` and ``migrate``: each in a namespace of its
  own, so a snippet imports what it uses.
- After each snippet ``later_django.testing.drain()`` runs the jobs it
  enqueued. Jobs it left delayed, or waiting for a retry, are made due as the
  dashboard's Run now action makes them, and drained too. Every job the snippet
  wrote, and every job those jobs wrote, must end ``success`` (a stage only
  a handler's run reaches) or ``cancelled``.
- On Django 5.2, ``django.tasks`` is read as ``django_tasks`` (the backport),
  as the guides tell readers on 5.2 to write it.

Run as a script (``python tests/docs/test_docs_switching.py SPEC REPORT``), this
module is that process: it reads the snippets from SPEC and writes what each
did to REPORT.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import pytest

ROOT = Path(__file__).resolve().parents[2]  # tests/docs/ is two folders down
DOCS = ROOT / "docs"
GUIDES = ["how-to/coming-from-celery.md", "how-to/coming-from-django-q2.md"]
COMPARISON = DOCS / "explanation" / "comparison.md"

# A fence's opening line: ```python, ```{code-block} python, ```sh, ...
FENCE = re.compile(r"^(`{3,})(.*)$")
# The first line of a fence that is a file of the project.
FILE_COMMENT = re.compile(r"^# ([\w][\w/.-]*\.py)$")
# What a job may end as once its snippet's jobs were drained.
FINISHED = {"success", "cancelled"}
# How often a snippet's delayed jobs and retries are made due and drained.
RUN_NOW_ROUNDS = 5


@dataclass(frozen=True)
class Fence:
    page: str
    line: int  # the line of the fence's first line of code, from 1
    info: str  # what follows the backticks: "python", "{code-block} python", "sh"
    code: str

    @property
    def path(self) -> str | None:
        """The project file this fence is, if its first line names one."""
        first = self.code.split("\n", 1)[0].strip()
        match = FILE_COMMENT.match(first)
        return match.group(1) if match else None


def fences(page: str) -> list[Fence]:
    """Every fenced block of ``page`` (a path under docs/), in order."""
    lines = (DOCS / page).read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        ticks, info = opening.group(1), opening.group(2).strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        found.append(Fence(page, i + 2, info, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


def later_fences(page: str) -> list[Fence]:
    return [fence for fence in fences(page) if fence.info == "python"]


def make_project(directory: Path) -> Path:
    """A fresh project as startproject and startapp make it; its root."""
    directory.mkdir()
    env = {**os.environ}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    for args in (["startproject", "mysite", str(directory)], ["startapp", "shop"]):
        subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=directory,
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
    with (directory / "mysite" / "settings.py").open("a") as settings:
        settings.write(
            "\n# The reader's own project: an app of theirs, mails kept in memory.\n"
            'INSTALLED_APPS += ["shop"]\n'
            'LOCMEM = "django.core.mail.backends.locmem.EmailBackend"\n'
            # Django 6.1's startproject configures MAILERS, and refuses EMAIL_BACKEND beside it.
            'if "MAILERS" in globals():\n'
            '    MAILERS["default"]["BACKEND"] = LOCMEM\n'
            "else:\n"
            "    EMAIL_BACKEND = LOCMEM\n"
        )
    return directory


def as_run_here(code: str) -> str:
    """``code`` as this Django runs it: on 5.2, Django's Tasks API is the
    django_tasks backport, as the guides tell readers on 5.2."""
    if django.VERSION < (6,):
        return re.sub(r"\bdjango\.tasks\b", "django_tasks", code)
    return code


def write_files(project: Path, page_fences: list[Fence]) -> None:
    for fence in page_fences:
        path = fence.path
        if path is None:
            continue
        target = project / "mysite" / "settings.py" if path == "settings.py" else project / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as file:
            file.write(f"\n# {fence.page}, line {fence.line}\n{as_run_here(fence.code)}")


def run_page(page: str, tmp_path: Path) -> list[dict[str, Any]]:
    """Run ``page``'s later_django fences in a fresh project; what each snippet did."""
    page_fences = later_fences(page)
    project = make_project(tmp_path / "site")
    write_files(project, page_fences)
    snippets = [
        {"page": f.page, "line": f.line, "code": as_run_here(f.code)}
        for f in page_fences
        if f.path is None
    ]
    spec, report = tmp_path / "spec.json", tmp_path / "report.json"
    spec.write_text(json.dumps({"snippets": snippets}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LATER_", "DATABASE_URL"))}
    # The checkout's later_django, not whatever the environment installed.
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    env["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    result = subprocess.run(
        [sys.executable, __file__, str(spec), str(report)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{page}: the runner failed\n{result.stdout}\n{result.stderr}"
    done: list[dict[str, Any]] = json.loads(report.read_text())
    assert len(done) == len(snippets), f"{page}: {len(snippets)} snippets, {len(done)} ran"
    return done


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: Path(page).stem)
def test_guide_runs_as_written(page: str, tmp_path: Path):
    """Every later_django fence of the guide runs as written, and every job
    a snippet enqueues runs to success (or was cancelled by the snippet)."""
    snippets = run_page(page, tmp_path)
    problems = []
    ran = 0
    for snippet in snippets:
        where = f"{page}, line {snippet['line']}"
        if snippet["error"]:
            problems.append(f"{where} raised:\n{snippet['error']}")
            continue
        # success is a stage only a handler's run reaches.
        unfinished = {i: s for i, s in snippet["jobs"].items() if s not in FINISHED}
        if unfinished:
            problems.append(f"{where}: jobs that did not run to the end: {unfinished}")
        ran += list(snippet["jobs"].values()).count("success")
    assert not problems, "\n\n".join(problems)
    assert ran >= 10, f"{page}: only {ran} of its jobs ran"


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: Path(page).stem)
def test_guide_fences_are_later_code_or_marked_as_another_librarys(page: str):
    """A guide's fences are ```python (run above), ```{code-block} python
    (another library's, shown only) or a shell or text block; another
    library's import in a ```python fence would be run and fail, so it is
    refused here by name."""
    others = ("celery", "django_q", "django_tasks_db", "kombu")
    for fence in fences(page):
        assert fence.info in {"python", "{code-block} python", "sh", "text"}, (
            f"{page}, line {fence.line}: fence ```{fence.info}"
        )
        if fence.info == "python":
            imported = re.findall(r"^\s*(?:from|import) (\w+)", fence.code, re.MULTILINE)
            assert not set(imported) & set(others), (
                f"{page}, line {fence.line}: another library's code in a ```python fence"
            )


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: Path(page).stem)
def test_guide_worker_commands_parse(page: str):
    """Every ``python manage.py later_worker ...`` line of a guide's shell
    fences is accepted by later_worker's own argument parser."""
    from later_django.management.commands.later_worker import Command

    commands = [
        shlex.split(line, comments=True)[3:]
        for fence in fences(page)
        if fence.info == "sh"
        for line in fence.code.splitlines()
        if line.startswith("python manage.py later_worker")
    ]
    assert commands, f"{page} shows no later_worker command"
    parser = Command().create_parser("manage.py", "later_worker")
    for args in commands:
        parser.parse_args(args)  # argparse exits (SystemExit) on what it refuses


def measured_rows() -> set[str]:
    """Every table row of the performance page and the SQLite results."""
    sources = [*DOCS.glob("**/performance*.md"), ROOT / "benchmarks" / "sqlite" / "RESULTS.md"]
    return {
        line.strip()
        for source in sources
        for line in source.read_text().splitlines()
        if line.startswith("|")
    }


def test_comparison_figures_are_rows_of_the_measured_runs():
    """Every figure row of the comparison's benchmark tables (a row that
    names a peer and holds a measured number) is a row, as written, of
    docs' performance page or of benchmarks/sqlite/RESULTS.md."""
    measured = measured_rows()
    figure_rows = [
        line.strip()
        for line in COMPARISON.read_text().split("## Measured side by side", 1)[1].splitlines()
        if line.startswith("| ")
        and re.search(r"\| [\d,]+\.?\d* \|", line)
        and not line.startswith("| peer ")
    ]
    assert len(figure_rows) >= 10, "the comparison lost its benchmark tables"
    invented = [row for row in figure_rows if row not in measured]
    assert not invented, "rows not found in the measured runs:\n" + "\n".join(invented)


# -- the runner: a process of its own, in the fresh project ---------------------------


def _job_ids() -> set[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM later_job")
        return {row[0] for row in cursor.fetchall()}


def _stages(ids: set[str]) -> dict[str, str]:
    import later_django as later

    stages = {}
    for job_id in sorted(ids):
        info = later.get_job(job_id)
        stages[job_id] = info.stage if info else "gone"
    return stages


def _run_jobs(before: set[str]) -> int:
    """Drain, make the new jobs still waiting for their time due, drain
    again; how many attempts ran."""
    from later_django.dashboard.actions import apply
    from later_django.testing import drain

    runs = len(drain())
    for _ in range(RUN_NOW_ROUNDS):
        stages = _stages(_job_ids() - before)
        due_later = [i for i, stage in stages.items() if stage in ("delayed", "requeued")]
        if not due_later:
            break
        apply("run_now", due_later)
        runs += len(drain())
    return runs


def _run_snippets(spec: Path, report: Path) -> None:
    import io

    django.setup()
    from django.core.management import call_command

    call_command("later_migrate", stdout=io.StringIO())
    call_command("migrate", verbosity=0)
    done = []
    for snippet in json.loads(spec.read_text())["snippets"]:
        code = snippet["code"]
        before = _job_ids()
        error, runs = None, 0
        try:
            compiled = compile(code, f"{snippet['page']}:{snippet['line']}", "exec")
            exec(compiled, {"__name__": "__main__"})
            runs = _run_jobs(before)
        except Exception:
            error = traceback.format_exc()
        jobs = _stages(_job_ids() - before)
        done.append({"line": snippet["line"], "jobs": jobs, "runs": runs, "error": error})
    report.write_text(json.dumps(done))


if __name__ == "__main__":
    _run_snippets(Path(sys.argv[1]), Path(sys.argv[2]))
