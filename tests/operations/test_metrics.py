"""Prometheus metrics: what the events hook feeds them, what a running
worker serves over HTTP, and that no label can carry a job, an error or a
server."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import later_django as later
from later_django import events
from later_django.metrics import gauges, job_events
from tests.helpers import PROJECT_DIR, set_later, wait_until
from tests.jobapp.jobs import Flaky, Noop, NoRetry, Ordered

FAMILIES = {
    "later_job_transitions",
    "later_job_handler_duration_seconds",
    "later_job_duration_seconds",
    "later_job_wait_duration_seconds",
    "later_queue_jobs",
    "later_queue_limited_jobs",
    "later_worker_commands",
    "later_job_duplicates",
    "later_workers",
    "later_retained_log_consumer_lag",
    "later_partition_queue_depth",
    "later_partition_backlog",
    "later_partition_oldest_head_age_seconds",
    "later_partitions_active",
    "later_partition_workers_live",
    "later_partition_claims",
    "later_partition_heads_claimed",
    "later_partition_lease_renewals",
}
FORBIDDEN_LABELS = {"job_id", "id", "error", "message", "owner", "server_id", "server"}
# A job id (26 lowercase base32 characters) or a server id (host-pid-hex).
LEAKED_VALUE = re.compile(r"^[0-9a-z]{26}$|-\d+-[0-9a-f]{6}$|error|Error|refused")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, list[Any]]:
    # prometheus_client also exports each counter's and histogram's start
    # time as a *_created family of its own.
    families = [
        f
        for f in text_string_to_metric_families(text)
        if f.name.startswith("later_") and not f.name.endswith("_created")
    ]
    samples: Samples = {}
    for family in families:
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, families


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (n, got), value in samples.items() if n == name and wanted <= set(got))


def assert_no_leak(families: Iterable[Any]) -> None:
    for family in families:
        for sample in family.samples:
            assert not FORBIDDEN_LABELS & set(sample.labels), (family.name, sample.labels)
            for value in sample.labels.values():
                assert not LEAKED_VALUE.search(value), (family.name, sample.labels)


# -- fed by events (no database) --------------------------------------------------


def test_events_feed_every_family_with_bounded_labels():
    registry = CollectorRegistry()
    fed = job_events.Metrics(registry)
    fed.workers.count = lambda: (4, 1)
    fed.queue.set(
        {("default", "enqueued"): 7, ("default", "delayed"): 2, ("emails", "enqueued"): 3}
    )
    job_id, server = "01m8s8vv2x5gqem8s8yze4en1y", "host-123-abcdef"
    fed.on_enqueued(events.JobEnqueued(job_id, "app.jobs.Mail", "enqueued", "default"))
    # The second success finds the series the first one made.
    for outcome, seconds, waited in (
        ("retry", 0.1, 0.02),
        ("succeeded", 0.3, 0.04),
        ("succeeded", 0.2, -0.01),
    ):
        fed.on_finished(
            events.JobFinished(
                job_id, "app.jobs.Mail", 1, outcome=outcome, handler_seconds=seconds,
                since_created=1.5, waited=waited, worker=3, server_id=server,
            )
        )  # fmt: skip
    fed.on_lease_lost(events.LeaseLost(job_id, 2, why="lease expired", worker=1, server_id=server))
    fed.on_duplicate(events.JobDuplicate(job_id, "app.jobs.Mail", "default", queue="emails"))
    samples, families = parse(generate_latest(registry).decode())
    assert {f.name for f in families} == FAMILIES
    mail = {"queue": "default", "job_type": "app.jobs.Mail"}
    assert total(samples, "later_job_duplicates_total", queue="emails") == 1
    assert total(samples, "later_job_transitions_total", state="enqueued", **mail) == 1
    assert total(samples, "later_job_transitions_total", state="running", **mail) == 3
    assert total(samples, "later_job_transitions_total", state="requeued", **mail) == 1
    assert total(samples, "later_job_transitions_total", state="success", **mail) == 2
    handler = "later_job_handler_duration_seconds"
    assert total(samples, f"{handler}_count", worker_id="3", outcome="retry") == 1
    assert total(samples, f"{handler}_sum", worker_id="3", outcome="succeeded") == 0.5
    assert total(samples, f"{handler}_bucket", le="0.25", outcome="succeeded") == 1
    assert total(samples, "later_job_duration_seconds_sum", outcome="succeeded") == 3.0
    # A wait below zero (this host's clock behind the database's) counts as 0.
    assert total(samples, "later_job_wait_duration_seconds_bucket", le="0.001", **mail) == 1
    assert total(samples, "later_job_wait_duration_seconds_count", **mail) == 3
    assert total(samples, "later_job_wait_duration_seconds_sum", **mail) == pytest.approx(0.06)
    commands = "later_worker_commands_total"
    assert total(samples, commands, worker_id="3", outcome="succeeded") == 2
    assert total(samples, commands, worker_id="3", outcome="failed") == 1
    assert total(samples, commands, worker_id="1", outcome="discarded") == 1
    assert total(samples, "later_queue_jobs", state="enqueued", queue="default") == 7
    assert total(samples, "later_queue_jobs", state="enqueued", queue="emails") == 3
    # The queue label is the job's queue.
    fed.on_enqueued(events.JobEnqueued(job_id, "app.jobs.Mail", "enqueued", "default", "emails"))
    fed.on_finished(
        events.JobFinished(
            job_id, "app.jobs.Mail", 1, outcome="succeeded", handler_seconds=0.1,
            since_created=1.0, waited=0.0, worker=3, server_id=server, queue="emails",
        )
    )  # fmt: skip
    samples, families = parse(generate_latest(registry).decode())
    emails = {"queue": "emails", "job_type": "app.jobs.Mail"}
    assert total(samples, "later_job_transitions_total", state="enqueued", **emails) == 1
    assert total(samples, "later_job_transitions_total", state="success", **emails) == 1
    assert total(samples, "later_job_transitions_total", state="success", **mail) == 2
    assert total(samples, "later_workers", state="active") == 4
    assert total(samples, "later_workers", state="busy") == 1
    assert_no_leak(families)


def test_the_leak_check_catches_a_job_id_or_an_error_as_a_label():
    """The guard above can fail: a family labelled with an id or an error."""
    from prometheus_client import Counter

    registry = CollectorRegistry()
    bad = Counter("later_bad_total", "", ["job_type"], registry=registry)
    bad.labels("01m8s8vv2x5gqem8s8yze4en1y").inc()
    _, families = parse(generate_latest(registry).decode())
    with pytest.raises(AssertionError):
        assert_no_leak(families)
    registry = CollectorRegistry()
    Counter("later_worse_total", "", ["error"], registry=registry).labels("boom").inc()
    _, families = parse(generate_latest(registry).decode())
    with pytest.raises(AssertionError):
        assert_no_leak(families)


def test_a_web_process_reads_the_counters_on_scrape_at_most_once_per_interval():
    collector = gauges.QueueCollector()
    reads: list[int] = []

    def read() -> dict[tuple[str, str], int]:
        reads.append(1)
        return {("default", "enqueued"): len(reads)}

    collector.read, collector.max_age = read, 3600.0
    registry = CollectorRegistry()
    registry.register(collector)
    for _ in range(3):
        samples, _ = parse(generate_latest(registry).decode())
    assert len(reads) == 1
    assert total(samples, "later_queue_jobs", state="enqueued") == 1


def test_partition_gauges_have_a_sample_for_every_partition_of_a_registered_topic(
    later_db, settings
):
    """Fed by partition_stats() as a worker feeds them, the partition gauges
    report each partition of a registered topic, 0 for one without a job."""
    set_later(settings, TOPICS={"ordered": 8})
    call_command("later_migrate", verbosity=0)
    first = later.partition_for_key("k", 8)
    second = next(
        key for key in (f"key-{n}" for n in range(100))
        if later.partition_for_key(key, 8) != first
    )  # fmt: skip
    for n in range(3):
        later.enqueue_to_partition(Ordered("k", n))
    later.enqueue_to_partition(Ordered(second, 0))
    registry = CollectorRegistry()
    collector = gauges.PartitionCollector()
    registry.register(collector)
    collector.set(later.partition_stats())
    samples, _ = parse(generate_latest(registry).decode())
    depth = partition_depths(samples, "ordered")
    assert sorted(depth) == list(range(8))
    assert depth[first] == 3 and sum(depth.values()) == 4
    assert list(depth.values()).count(0) == 6
    assert total(samples, "later_partition_backlog", topic="ordered") == 4


def partition_depths(samples: Samples, topic: str) -> dict[int, float]:
    """later_partition_queue_depth of each partition of ``topic``."""
    return {
        int(dict(labels)["partition"]): value
        for (name, labels), value in samples.items()
        if name == "later_partition_queue_depth" and ("topic", topic) in labels
    }


# -- a running worker, scraped over HTTP -------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_a_worker_serves_what_happened_on_its_metrics_port(later_db, workers):
    """After a known workload, the worker's endpoint counts exactly its
    transitions, handler runs by outcome, commands, queue depths and workers."""
    port = free_port()
    proc = workers.start(
        "--metrics-port", str(port), "--metrics-addr", "127.0.0.1",
        timings={"METRICS_REFRESH_INTERVAL": 0.2}, workers=3,
    )  # fmt: skip
    workers.wait_registered(proc)
    noops = later.enqueue_many([Noop(n=n) for n in range(20)])
    flaky = later.enqueue(Flaky(succeed_on=2))  # fails once, then succeeds
    refused = later.enqueue(NoRetry())  # fails for good
    for n in range(3):
        later.enqueue_delayed(Noop(n=100 + n), timedelta(hours=1))
    for job_id in [*noops, flaky]:
        workers.wait_stage(job_id, "success", 30)
    workers.wait_stage(refused, "failed", 30)

    def settled() -> Samples | None:
        samples, _ = parse(scrape(port))
        done = total(samples, "later_worker_commands_total")
        depth = total(samples, "later_queue_jobs", state="success")
        return samples if done == 23 and depth == 21 else None

    samples = wait_until(settled, 20, lambda: f"the scrape to settle:\n{scrape(port)}")
    transitions = "later_job_transitions_total"
    assert total(samples, transitions, state="running") == 23
    assert total(samples, transitions, state="success") == 21
    assert total(samples, transitions, state="requeued") == 1
    assert total(samples, transitions, state="failed") == 1
    assert total(samples, transitions, state="running", job_type="tests.jobapp.jobs.Flaky") == 2
    handler = "later_job_handler_duration_seconds_count"
    assert total(samples, handler, outcome="succeeded") == 21
    assert total(samples, handler, outcome="retry") == 1
    assert total(samples, handler, outcome="failed") == 1
    assert total(samples, "later_job_wait_duration_seconds_count") == 23
    assert total(samples, "later_job_duration_seconds_count") == 23
    assert total(samples, "later_worker_commands_total", outcome="succeeded") == 21
    assert total(samples, "later_worker_commands_total", outcome="failed") == 2
    assert total(samples, "later_queue_jobs", state="delayed") == 3
    assert total(samples, "later_queue_jobs", state="failed") == 1
    assert total(samples, "later_queue_jobs", state="enqueued") == 0
    assert total(samples, "later_workers", state="active") == 3
    assert total(samples, "later_workers", state="busy") == 0
    _, families = parse(scrape(port))
    assert {f.name for f in families} >= FAMILIES
    assert_no_leak(families)


def test_a_worker_with_topics_serves_partition_depth_and_head_age(later_db, workers, settings):
    """Depth is the partition's unfinished jobs; a head not due yet has no
    age; the worker's own partition workers and claims are counted."""
    set_later(settings, TOPICS={"ordered": 8})
    for n in range(3):
        later.enqueue_to_partition_delayed(Ordered("k", n), timedelta(hours=1))
    partition = str(later.partition_for_key("k", 8))
    port = free_port()
    proc = workers.start(
        "--metrics-port", str(port), "--metrics-addr", "127.0.0.1",
        timings={"METRICS_REFRESH_INTERVAL": 0.2}, workers=1,
        env={"LATER_TEST_SETTINGS": json.dumps({"TOPICS": {"ordered": 8}})},
    )  # fmt: skip
    workers.wait_registered(proc)

    def depth() -> Samples | None:
        samples, _ = parse(scrape(port))
        found = total(samples, "later_partition_queue_depth", topic="ordered", partition=partition)
        return samples if found == 3 else None

    samples = wait_until(depth, 20, lambda: f"the partition depth:\n{scrape(port)}")
    # The worker registered the topic: its empty partitions are reported too.
    assert sorted(partition_depths(samples, "ordered")) == list(range(8))
    assert total(samples, "later_partition_backlog", topic="ordered") == 3
    assert total(samples, "later_partition_oldest_head_age_seconds", topic="ordered") == 0
    assert total(samples, "later_partition_workers_live") == 1
    free_key = next(
        key for key in (f"key-{n}" for n in range(100))
        if str(later.partition_for_key(key, 8)) != partition
    )  # fmt: skip
    ready = later.enqueue_to_partition(Ordered(free_key, 0))
    workers.wait_stage(ready, "success", 20)

    def claimed() -> Samples | None:
        samples, _ = parse(scrape(port))
        return samples if total(samples, "later_partition_heads_claimed_total") >= 1 else None

    samples = wait_until(claimed, 20, lambda: f"the claim counted:\n{scrape(port)}")
    assert total(samples, "later_partition_claims_total", topic="ordered") >= 1
    assert total(samples, "later_partitions_active", topic="ordered") >= 1
    assert_no_leak(parse(scrape(port))[1])


def test_worker_metrics_port_in_use_is_a_clear_error(later_db, workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = workers.start("--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
        assert proc.proc.wait(60) != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in proc.output()
    assert "pick another --metrics-port" in proc.output()


def test_worker_metrics_help_says_which_address_it_binds(monkeypatch):
    """later_worker --help says the metrics endpoint listens on every IPv4
    interface by default, and how to narrow it."""
    from later_django.management.commands.later_worker import Command

    monkeypatch.setenv("COLUMNS", "1000")  # argparse would break "--metrics-addr" at its hyphen
    text = " ".join(Command().create_parser("manage.py", "later_worker").format_help().split())
    assert (
        "serve Prometheus metrics over HTTP on this port (path /metrics), on every IPv4 "
        "interface unless --metrics-addr says otherwise"
    ) in text
    assert (
        "the address --metrics-port listens on (default 0.0.0.0: every IPv4 interface; "
        "127.0.0.1 for this host only, :: for IPv6)"
    ) in text


# -- a web process with django-prometheus ------------------------------------------
WEB_SCRAPE = """
import datetime as dt
import django
django.setup()
from django.test import RequestFactory
from django_prometheus.exports import ExportToDjangoView
import later_django as later
from tests.jobapp.jobs import Noop
later.enqueue(Noop(n=1))
later.enqueue_delayed(Noop(n=2), dt.timedelta(hours=1))
print(ExportToDjangoView(RequestFactory().get("/metrics")).content.decode())
"""


def test_a_web_process_with_django_prometheus_exports_later_metrics(later_db):
    """django-prometheus's /metrics view shows the enqueues of its process
    and the namespace's queue depth read from the counters."""
    pytest.importorskip("django_prometheus", reason="django-prometheus supports Django < 6.1")
    env = {**later_db.worker_env(), "LATER_TEST_EXTRA_APPS": "django_prometheus"}
    done = subprocess.run(
        [sys.executable, "-c", WEB_SCRAPE],
        cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    samples, families = parse(done.stdout)
    transitions = "later_job_transitions_total"
    assert total(samples, transitions, state="enqueued", job_type="tests.jobapp.jobs.Noop") == 1
    assert total(samples, transitions, state="delayed") == 1
    assert total(samples, "later_queue_jobs", state="enqueued") == 1
    assert total(samples, "later_queue_jobs", state="delayed") == 1
    assert_no_leak(families)
