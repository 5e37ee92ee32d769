"""A throwaway PostgreSQL server for the test suite, started from initdb/pg_ctl.

``ensure_postgres_url()`` returns LATER_TEST_POSTGRES_URL when it is set.
Otherwise it starts a server in a temporary folder on a free loopback port,
exports its URL so child processes (workers, xdist) reuse it, and stops it
when the process that started it exits. Under CI=true a failure raises; a
green run always means both databases ran.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from urllib.parse import urlsplit

ENV_URL = "LATER_TEST_POSTGRES_URL"
PG_BIN_CANDIDATES = ["/usr/lib/postgresql/*/bin"]


class PostgresUnavailable(RuntimeError):
    pass


def _pg_bin() -> str:
    explicit = os.environ.get("LATER_TEST_PG_BIN")
    if explicit:
        return explicit
    for pattern in PG_BIN_CANDIDATES:
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.path.exists(os.path.join(path, "initdb")):
                return path
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    raise PostgresUnavailable(
        f"no initdb found: install PostgreSQL (apt-get install postgresql) or set {ENV_URL}"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as(user: str | None, argv: list[str]) -> subprocess.CompletedProcess[str]:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def start_server() -> tuple[str, str, str | None]:
    """Start a server; return (url, data_dir, os_user)."""
    bin_dir = _pg_bin()
    # initdb refuses to run as root; run the server as the postgres user then.
    user = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
            user = "postgres"
        except KeyError:
            user = "nobody"
    root = tempfile.mkdtemp(prefix="later-test-pg-")
    data = os.path.join(root, "data")
    if user is not None:
        info = pwd.getpwnam(user)
        os.chown(root, info.pw_uid, info.pw_gid)
    port = _free_port()
    init_args = ["-D", data, "-U", "later", "-A", "trust", "-E", "UTF8", "--no-sync"]
    init = _run_as(user, [f"{bin_dir}/initdb", *init_args])
    if init.returncode != 0:
        raise PostgresUnavailable(f"initdb failed: {init.stderr.strip()}")
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
        "-c max_connections=300 -c shared_buffers=128MB"
    )
    log_file = os.path.join(root, "log")
    start_args = ["-D", data, "-l", log_file, "-w", "-t", "60", "-o", options, "start"]
    start = _run_as(user, [f"{bin_dir}/pg_ctl", *start_args])
    if start.returncode != 0:
        log = ""
        if os.path.exists(log_file):
            with open(log_file) as fh:
                log = fh.read()[-2000:]
        raise PostgresUnavailable(f"pg_ctl start failed: {start.stderr.strip()} {log}")
    url = f"postgresql://later@127.0.0.1:{port}/postgres"
    return url, data, user


def stop_server(data: str, user: str | None) -> None:
    bin_dir = _pg_bin()
    _run_as(user, [f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"])
    shutil.rmtree(os.path.dirname(data), ignore_errors=True)


def ensure_postgres_url() -> str | None:
    """Return a PostgreSQL URL for the tests, starting a server if needed.

    Returns None (the PostgreSQL half of the suite then reports itself as
    skipped) only outside CI when no server can be started.
    """
    url = os.environ.get(ENV_URL)
    if url:
        return url
    try:
        url, data, user = start_server()
    except PostgresUnavailable:
        if os.environ.get("CI", "").lower() == "true":
            raise
        return None
    os.environ[ENV_URL] = url
    owner = os.getpid()

    def stop() -> None:
        if os.getpid() == owner:
            stop_server(data, user)

    atexit.register(stop)
    return url


def database_settings(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/") or "postgres",
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "TEST": {"NAME": "later_test"},
    }
