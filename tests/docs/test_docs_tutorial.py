"""The tutorial (docs/tutorial/) runs as written, on SQLite, in a fresh Django
project made in a temporary folder: the reader's commands, the files they
write, a real ``runserver`` and ``later_worker``, and chromium for what the
reader does in a browser.

How a page's blocks are run (tests/docs_blocks.py reads them):

- A ```` ```python ```` block whose first line is a comment naming a file
  (``# shop/jobs.py``), or an ```` ```html ```` block whose first line is a
  Django template comment naming one (``{# shop/templates/x.html #}``), is
  added at the end of that file, relative to the folder of ``manage.py``;
  the file is created if it does not exist. That is what the tutorial tells
  the reader to do.
- Any other ```` ```python ```` block is typed into the page's
  ``python manage.py shell``, in order: names carry from one block to the
  next. Before each, the test waits until the worker has run every job due
  within 15 seconds (a schedule's occurrences aside), as a reader who reads
  "five seconds later" waits.
- In a ```` ```console ```` block, each line starting with ``$ `` is a
  command, the other lines its output (not run); in a ```` ```sh ```` block
  every line but comments is a command. ```` ```text ```` blocks are output.
- Commands: ``python`` is this test's interpreter and ``django-admin`` is
  ``python -m django``. Making the virtual environment and ``pip install``
  are skipped: the package is installed where the test runs. ``cd`` changes
  the folder. ``manage.py runserver`` and ``manage.py later_worker`` keep
  running in the background (the server without its autoreloader, on a free
  port that stands for the pages' ``127.0.0.1:8000``); starting one again
  stops the running one first with SIGINT, as Ctrl-C does, and it must exit
  with status 0. ``manage.py shell`` opens the page's shell.
  ``manage.py createsuperuser`` takes its answers from
  ``DJANGO_SUPERUSER_*``. Any other command must exit with status 0.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser import screenshot
from tests.docs_blocks import Block, read_blocks
from tests.helpers import PROJECT_DIR, wait_until

# Real processes and a browser: Django's version changes nothing (tox.ini).
pytestmark = [pytest.mark.slow, pytest.mark.one_env]

TUTORIAL = PROJECT_DIR / "docs" / "tutorial"
PAGES = ["index.md", "retries-delays-schedules.md"]
ADMIN = ("admin", "tutorial-password")
START_TIMEOUT = 60.0  # seconds for runserver or later_worker to be ready
JOB_TIMEOUT = 60.0  # seconds for the worker to run what the reader enqueued
COMMAND_TIMEOUT = 120.0
SKIPPED = (["source"], ["python", "-m", "venv"], ["python", "-m", "pip"], ["pip"])
DEV_SERVER = "127.0.0.1:8000"

# Typed into `manage.py shell -c`: runs each block it is sent in one
# namespace (a probe in a fresh one) and answers with one JSON line.
SHELL_DRIVER = """
import contextlib, io, json, sys, traceback
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    scope = namespace if request["kind"] == "block" else {"__name__": "probe"}
    out, error = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(request["code"], "<tutorial block>", "exec"), scope)
    except BaseException:
        error = traceback.format_exc()
    reply = {"reply": True, "out": out.getvalue(), "error": error, "result": scope.get("result")}
    sys.__stdout__.write(json.dumps(reply, default=str) + "\\n")
    sys.__stdout__.flush()
"""
# Jobs the reader would still be waiting for.
PENDING_PROBE = """
import time
from django.db.models import Q
from later_django.models import Job
soon = int(time.time() * 1000) + 15_000
result = list(
    Job.objects.filter(recurring__isnull=True)
    .filter(
        Q(stage__in=["enqueued", "running", "requeued"])
        | Q(stage="delayed", run_at_ms__lt=soon)
    )
    .values_list("type_name", "stage")
)
"""


def expected_prints(code: str) -> list[str | None]:
    """For each ``print(...)`` line of a shell block, what the page says it
    prints: the comment at its end, or a comment line right below it; None
    when it says nothing."""
    lines = code.splitlines()
    expected: list[str | None] = []
    for number, line in enumerate(lines):
        if line.startswith("print("):
            said = line.split("  # ", 1)[1] if "  # " in line else None
            below = lines[number + 1] if number + 1 < len(lines) else ""
            if said is None and below.startswith("# "):
                said = below[2:]
            expected.append(said)
    return expected


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Background:
    """A command left running, as in a terminal of its own."""

    argv: list[str]
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT, then the exit status (SIGKILL past the timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(30)


class Shell:
    """``python manage.py shell``, fed one block at a time."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*argv, "-c", SHELL_DRIVER],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.other: list[str] = []  # what the shell printed beside its answers
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def run(self, code: str, kind: str = "block") -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"kind": kind, "code": code}) + "\n")
        self.proc.stdin.flush()
        while True:
            try:
                line = self.lines.get(timeout=COMMAND_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"the shell did not answer:\n{code}") from None
            assert line, "the shell exited:\n" + "".join(self.other)
            if line.startswith('{"reply": true'):
                return json.loads(line)
            self.other.append(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


@dataclass
class Reader:
    """Follows the tutorial: its folder, its terminals, what it typed."""

    root: Path
    env: dict[str, str]
    port: int
    cwd: Path = field(init=False)
    running: dict[str, Background] = field(default_factory=dict)
    shell: Shell | None = None
    shell_output: list[str] = field(default_factory=list)  # every line printed
    before_block: dict[str, Callable[[], None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cwd = self.root

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, words: list[str]) -> list[str]:
        if words[0] == "python":
            return [sys.executable, *words[1:]]
        if words[0] == "django-admin":
            return [sys.executable, "-m", "django", *words[1:]]
        raise AssertionError(f"a command the test does not know how to run: {words}")

    # -- blocks ----------------------------------------------------------------
    def follow(self, page: str) -> None:
        blocks = read_blocks(TUTORIAL / page)
        assert blocks, f"{page} has no code block"
        for block in blocks:
            where = f"{page}:{block.line}"
            if block.file:
                self.write(block)
            elif block.language == "python":
                self.type_into_shell(block, where)
            elif block.language in ("console", "sh"):
                for words in block.commands():
                    self.command(words, where)
            else:
                assert block.language == "text", f"{where}: a {block.language!r} block"
        if self.shell is not None:
            self.shell.close()
            self.shell = None

    def write(self, block: Block) -> None:
        assert block.file is not None
        path = self.cwd / block.file
        path.parent.mkdir(parents=True, exist_ok=True)
        before = path.read_text() if path.exists() else ""
        path.write_text(before + ("\n\n" if before else "") + block.code)

    def type_into_shell(self, block: Block, where: str) -> None:
        if self.shell is None:
            self.shell = Shell(self.argv(["python", "manage.py", "shell"]), self.cwd, self.env)
        for marker, hook in self.before_block.items():
            if marker in block.code:
                hook()
        self.wait_for_worker()
        reply = self.shell.run(block.code)
        assert reply["error"] is None, f"{where}:\n{block.code}\n{reply['error']}"
        printed = str(reply["out"]).splitlines()
        self.shell_output += printed
        expected = expected_prints(block.code)
        assert len(printed) == len(expected), f"{where}: one line per print, got {printed}"
        for line, want in zip(printed, expected, strict=True):
            assert want is None or line == want, f"{where}: printed {line!r}, the page: {want!r}"

    def wait_for_worker(self) -> None:
        assert self.shell is not None
        shell = self.shell

        def pending() -> object:
            reply = shell.run(PENDING_PROBE, kind="probe")
            assert reply["error"] is None, reply["error"]
            return reply["result"]

        wait_until(
            lambda: pending() == [],
            JOB_TIMEOUT,
            lambda: f"the worker to run {pending()}; its output:\n{self.worker_output()}",
            interval=0.2,
        )

    # -- commands --------------------------------------------------------------
    def command(self, words: list[str], where: str) -> None:
        if any(words[: len(skip)] == list(skip) for skip in SKIPPED):
            return
        if words[0] == "cd":
            self.cwd = (self.cwd / words[1]).resolve()
            return
        if words[:2] == ["python", "manage.py"] and len(words) > 2:
            name = words[2]
            if name == "shell":
                assert self.shell is None, f"{where}: a second shell"
                self.shell = Shell(self.argv(words), self.cwd, self.env)
                return
            if name in ("runserver", "later_worker"):
                self.start(name, words, where)
                return
            if name == "createsuperuser":
                words = [*words, "--noinput"]
        result = subprocess.run(
            self.argv(words),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert result.returncode == 0, f"{where}: {words}\n{result.stdout}\n{result.stderr}"

    def start(self, name: str, words: list[str], where: str) -> None:
        self.stop(name)
        if name == "runserver":
            words = [*words, "--noreload", f"127.0.0.1:{self.port}"]
        log = self.root / f"{name}-{len(self.running)}-{os.urandom(2).hex()}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.argv(words),
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = self.running[name] = Background(words, proc, log)

        def ready() -> bool:
            code = proc.poll()
            assert code is None, f"{where}: {words} exited with {code}:\n{started.output()}"
            if name == "later_worker":
                return " started: " in started.output()
            try:
                with urllib.request.urlopen(f"{self.base_url}/admin/login/", timeout=5):
                    return True
            except OSError:
                return False

        wait_until(ready, START_TIMEOUT, lambda: f"{words} to be ready:\n{started.output()}")

    def stop(self, name: str) -> None:
        running = self.running.get(name)
        if running is not None:
            code = running.interrupt()
            assert code == 0, f"{running.argv} exited with {code} on Ctrl-C:\n{running.output()}"

    def worker_output(self) -> str:
        worker = self.running.get("later_worker")
        return worker.output() if worker else ""

    def wait_for_worker_output(self, text: str) -> None:
        wait_until(
            lambda: text in self.worker_output(),
            JOB_TIMEOUT,
            lambda: f"the worker to print {text!r}:\n{self.worker_output()}",
        )

    def url(self, text: str) -> str:
        """A URL of the pages, on the test's server."""
        return text.replace(DEV_SERVER, f"127.0.0.1:{self.port}")


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    """A reader in an empty folder, with a clean environment: no settings
    module, no test variables; the repository's later_django first on the
    path (the copy under test), output unbuffered as in a terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LATER_"))}
    env.pop("DATABASE_URL", None)
    env |= {
        "PYTHONPATH": str(PROJECT_DIR),
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SUPERUSER_USERNAME": ADMIN[0],
        "DJANGO_SUPERUSER_PASSWORD": ADMIN[1],
        "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
    }
    following = Reader(root=tmp_path, env=env, port=free_port())
    try:
        yield following
    finally:
        if following.shell is not None:
            following.shell.proc.kill()
        for running in following.running.values():
            running.interrupt()


def place_an_order(reader: Reader, page: Page) -> None:
    """ "Open http://127.0.0.1:8000/order/ and press Place order"."""
    page.goto(reader.url(f"http://{DEV_SERVER}/order/"))
    page.get_by_role("button", name="Place order").click()
    expect(page.locator("body")).to_have_text("Order 1 placed.")


def see_it_in_the_dashboard(reader: Reader, page: Page) -> None:
    """ "Open http://127.0.0.1:8000/admin/later/ and log in": the overview
    counts the job as a success, and the Jobs tab lists and opens it."""
    page.goto(reader.url(f"http://{DEV_SERVER}/admin/later/"))
    page.fill("#id_username", ADMIN[0])
    page.fill("#id_password", ADMIN[1])
    page.click("#login-form [type=submit]")
    expect(page).to_have_url(f"{reader.base_url}/admin/later/")
    expect(page.locator('[data-stage-count="success"]')).to_have_text("1")
    screenshot(page, "tutorial-dashboard")
    page.get_by_role("link", name="Jobs", exact=True).click()
    row = page.locator("table#later-jobs tbody tr[data-job-id]")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("shop.jobs.SendReceipt")
    expect(row).to_contain_text("success")
    row.locator("a.later-id").click()
    expect(page.locator("#later-job-stage")).to_have_text("success")
    expect(page.locator("#later-history li")).to_have_count(3)  # enqueued, running, success
    screenshot(page, "tutorial-job")


def test_docs_tutorial_runs_as_written(reader: Reader, page: Page):
    """Both pages, in order, in one project: the first ends with the site
    and a worker running and the reader in the browser, the second goes on
    from there."""
    reader.follow("index.md")
    place_an_order(reader, page)
    reader.wait_for_worker_output("sending the receipt of order 1 to ada@example.com")
    see_it_in_the_dashboard(reader, page)
    first_worker = reader.running["later_worker"]

    # "Every ten seconds the worker prints ...": seen before it is removed.
    reader.before_block['later.remove_recurring("sales-report")'] = lambda: (
        reader.wait_for_worker_output("Orders so far: 1 orders")
    )
    reader.follow("retries-delays-schedules.md")

    assert reader.running["later_worker"] is not first_worker, "the worker was restarted"
    assert (
        "(shop.jobs.ChargeCard) attempt 1 failed, retrying: "
        "ConnectionError: the payment provider timed out"
    ) in reader.worker_output()
    assert "charged order 1 at attempt 2" in reader.worker_output()
    # What the page's prints say they print was checked as they ran.
    assert "success 2" in reader.shell_output
    assert reader.worker_output().count("sending the receipt of order 1") == 1  # the delayed one
    reader.stop("later_worker")  # Ctrl-C: exits with status 0
