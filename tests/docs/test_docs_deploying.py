"""The deployment pages say what later_django's commands and settings accept.

docs/how-to/deploying.md and docs/how-to/postgresql-hosts.md show command
lines, a systemd unit, a Dockerfile, Compose and Kubernetes manifests and
settings that nothing here runs (no systemd, Docker, Kubernetes or PgBouncer).
What can be checked without them, is:

- every ``manage.py later_*`` command of their fenced blocks (a shell line, a
  systemd ``ExecStart=``, a Dockerfile ``CMD``, a YAML command list) is
  accepted by that command's own argument parser;
- their YAML blocks parse, and their Python blocks compile;
- every stop timeout given to a ``later_worker`` (systemd's
  ``TimeoutStopSec``, Compose's ``stop_grace_period``, Kubernetes'
  ``terminationGracePeriodSeconds``) is at least twice its shutdown timeout
  (its ``--shutdown-timeout``, else ``SHUTDOWN_TIMEOUT``'s default read from
  ``later_django.conf``) plus 30 s, as the page tells readers to give it, and
  the figures the page states for the default are that default's.
"""

from __future__ import annotations

import json
import re
import shlex
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import load_command_class
from django.core.management.base import CommandError

from later_django.conf import DEFAULTS
from tests.docs_blocks import Block, read_blocks
from tests.helpers import PROJECT_DIR

DOCS = PROJECT_DIR / "docs" / "how-to"
PAGES = ["deploying.md", "postgresql-hosts.md"]
DEPLOYING = DOCS / "deploying.md"
COMMANDS = {"later_worker", "later_health", "later_migrate"}
# A line that shows a later command: `manage.py later_x` or `"manage.py", "later_x"`.
SHOWS_COMMAND = re.compile(r'manage\.py"?,?\s*"?later_')
# The stop timeout the page asks for: twice the shutdown timeout plus this.
STOP_MARGIN = 30.0
DEFAULT_SHUTDOWN = DEFAULTS["SHUTDOWN_TIMEOUT"].total_seconds()
# systemd time spans and Compose durations: 90s, 1min 30s, 1m30s, 630.
SPAN_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|sec|min|h|s|m)?")
SPAN_UNITS = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "ms": 0.001}


def page_blocks() -> Iterator[tuple[str, Block]]:
    for page in PAGES:
        for block in read_blocks(DOCS / page):
            yield page, block


def after_manage_py(tokens: list[str]) -> list[str] | None:
    """The command and its arguments following ``manage.py`` in ``tokens``, up
    to a shell operator; None when no later command follows it."""
    if "manage.py" not in tokens:
        return None
    args: list[str] = []
    for token in tokens[tokens.index("manage.py") + 1 :]:
        if token and set(token) <= set("();<>|&"):
            break
        args.append(token)
    return args if args and args[0].startswith("later_") else None


def line_command(line: str) -> list[str] | None:
    """The later command a line of any block shows: an exec-form list
    (``CMD [...]``, ``command: [...]``) or a shell or systemd command line."""
    if '"manage.py"' in line and "[" in line:
        tokens = json.loads(line[line.index("[") : line.rindex("]") + 1])
    else:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    return after_manage_py(tokens)


def shown_commands() -> list[tuple[str, list[str]]]:
    """Every later command of the pages' blocks, with where it is."""
    found = []
    for page, block in page_blocks():
        for offset, line in enumerate(block.code.splitlines(), 1):
            if not SHOWS_COMMAND.search(line) or line.lstrip().startswith(("#", ";")):
                continue
            args = line_command(line)
            where = f"{page}, line {block.line + offset}"
            assert args is not None, f"{where}: a later command this test cannot read: {line}"
            found.append((where, args))
    return found


def parse(args: list[str], where: str) -> Namespace:
    """``args`` (the command's name first) as that command's parser reads them."""
    name = args[0]
    assert name in COMMANDS, f"{where}: {name} is not one of later's commands here"
    parser = load_command_class("later_django", name).create_parser("manage.py", name)
    try:
        return parser.parse_args(args[1:])
    except (CommandError, SystemExit) as exc:
        pytest.fail(f"{where}: manage.py {shlex.join(args)} is refused: {exc}")


def stop_floor(args: list[str], where: str) -> float:
    """The least stop timeout the page allows a later_worker run with ``args``."""
    given = parse(args, where).shutdown_timeout
    shutdown = DEFAULT_SHUTDOWN if given is None else float(given)
    return 2 * shutdown + STOP_MARGIN


def span_seconds(value: str) -> float:
    text = str(value).strip()
    parts = SPAN_PART.findall(text)
    assert parts and SPAN_PART.sub("", text).strip() == "", f"not a time span: {value!r}"
    return sum(float(number) * SPAN_UNITS[unit or None] for number, unit in parts)


def yaml_documents() -> Iterator[tuple[str, Any]]:
    yaml = pytest.importorskip("yaml")
    for page, block in page_blocks():
        if block.language in ("yaml", "yml"):
            for document in yaml.safe_load_all(block.code):
                yield f"{page}, block at line {block.line}", document


def worker_args(command: Any) -> list[str] | None:
    """A YAML command list's later_worker arguments, if it runs one."""
    if not isinstance(command, list):
        return None
    args = after_manage_py([str(part) for part in command])
    return args if args and args[0] == "later_worker" else None


def test_every_later_command_shown_parses():
    commands = shown_commands()
    for where, args in commands:
        parse(args, where)
    shown = {args[0] for where, args in commands if where.startswith("deploying.md")}
    assert shown == COMMANDS, f"deploying.md shows {sorted(shown)}"


def test_yaml_blocks_parse():
    documents = list(yaml_documents())
    assert len(documents) >= 3  # the Compose file, the Deployment, the Job
    for where, document in documents:
        assert isinstance(document, dict), f"{where}: not a mapping"


def test_python_blocks_compile():
    blocks = [(page, b) for page, b in page_blocks() if b.language == "python"]
    assert blocks
    for page, block in blocks:
        compile(block.code, f"{page}, block at line {block.line}", "exec")


def test_systemd_stop_timeouts_outlast_the_drain():
    units = 0
    for page, block in page_blocks():
        if block.language != "systemd":
            continue
        where = f"{page}, unit at line {block.line}"
        keys: dict[str, str] = {}
        for line in block.code.splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith(("#", ";", "[")):
                keys[key.strip()] = value.strip()
        args = line_command(keys.get("ExecStart", ""))
        if args is None or args[0] != "later_worker":
            continue
        units += 1
        assert "TimeoutStopSec" in keys, f"{where}: no TimeoutStopSec"
        assert span_seconds(keys["TimeoutStopSec"]) >= stop_floor(args, where), where
        if "[Service]" in block.code:  # the complete unit
            assert keys.get("KillSignal") == "SIGTERM", where
            assert keys.get("KillMode") == "mixed", where
            assert keys.get("Restart") == "on-failure", where
    assert units >= 1, "no systemd unit runs later_worker"


def test_compose_and_kubernetes_stop_timeouts_outlast_the_drain():
    services = deployments = 0
    for where, document in yaml_documents():
        for name, service in (document.get("services") or {}).items():
            args = worker_args(service.get("command"))
            if args is None:
                continue
            services += 1
            grace = span_seconds(str(service.get("stop_grace_period", "10s")))
            assert grace >= stop_floor(args, where), f"{where}: service {name}"
        if document.get("kind") != "Deployment":
            continue
        pod = document["spec"]["template"]["spec"]
        for container in pod["containers"]:
            args = worker_args(container.get("command"))
            if args is None:
                continue
            deployments += 1
            grace = float(pod.get("terminationGracePeriodSeconds", 30))
            assert grace >= stop_floor(args, where), f"{where}: container {container['name']}"
    assert services >= 1, "no Compose service runs later_worker"
    assert deployments >= 1, "no Kubernetes Deployment runs later_worker"


def test_the_stated_default_is_the_settings_default():
    text = " ".join(DEPLOYING.read_text().split())
    default = f"{DEFAULT_SHUTDOWN:g}"
    assert f"`SHUTDOWN_TIMEOUT` ({default} s by default" in text
    assert f"{2 * DEFAULT_SHUTDOWN + STOP_MARGIN:g} s with the default" in text
