"""Merge raw/*.json of a SQLite run into results.json and a markdown table.

    python3 summary.py --raw OUT/raw --logs OUT/logs --out OUT --common SHARED/common

The figures are the driver's medians; each gets a last row with later_django's
ratio to the best other peer. Standard library only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sqlite3
import sys

MAIN = "later_django"
MAIN_PACKAGE = {
    "later_django": "later-django",
    "django_tasks_db": "django-tasks-db",
    "django_q2": "django-q2",
}
# (workload, key, header, digits, higher is better)
FIGURES = (
    ("w1_single", "jobs_per_s", "W1 enqueue jobs/s", 0, True),
    ("w1_bulk", "jobs_per_s", "W1 bulk jobs/s", 0, True),
    ("w2_drain", "jobs_per_s", "W2 drain jobs/s", 0, True),
    ("w2_drain", "wall_s_incl_startup", "W2 wall s (incl. start-up)", 2, False),
    ("w3_latency", "p50_ms", "W3 p50 ms", 1, False),
    ("w3_latency", "p95_ms", "W3 p95 ms", 1, False),
    ("w3_latency", "p99_ms", "W3 p99 ms", 1, False),
)
LOCKED = b"database is locked"


def load(raw: str, order: list[str]) -> dict[str, dict]:
    peers = {}
    for path in sorted(glob.glob(os.path.join(raw, "*.json"))):
        with open(path) as f:
            peers[os.path.basename(path)[:-5]] = json.load(f)
    first = [p for p in order if p in peers]
    return {k: peers[k] for k in first + sorted(set(peers) - set(first))}


def ratio_cell(peers: dict[str, dict], med, workload: str, key: str, higher: bool) -> str:
    mine = med(peers.get(MAIN, {}), workload, key)
    others = {n: med(p, workload, key) for n, p in peers.items() if n != MAIN}
    others = {n: v for n, v in others.items() if v}
    if not mine or not others:
        return "–"
    best = (max if higher else min)(others, key=others.get)
    return f"{mine / others[best]:.2f}× ({best})"


def delivery(p: dict) -> str:
    """Jobs run / enqueued over every W2 and W3 run, and W2 duplicate runs."""
    cells = []
    for workload in ("w2_drain", "w3_latency"):
        runs = (p.get("workloads", {}).get(workload) or {}).get("runs", [])
        done = sum(r.get("completed", 0) for r in runs)
        cells.append(f"{done:,}/{sum(r.get('jobs', 0) for r in runs):,}")
    runs = (p.get("workloads", {}).get("w2_drain") or {}).get("runs", [])
    return " / ".join(cells) + f" | {sum(r.get('duplicates', 0) for r in runs)}"


def locked_lines(logs: str, peer: str) -> int:
    count = 0
    for path in glob.glob(os.path.join(logs, f"{peer}-*.log")):
        with open(path, "rb") as f:
            count += sum(1 for line in f if LOCKED in line)
    return count


def markdown(res: dict, report) -> str:
    env, cfg, peers = res["environment"], res["config"] or {}, res["peers"]
    fmt, med = report.fmt, report.med
    out = [f"# SQLite peer benchmark ({env['date_utc']} UTC)", ""]
    out.append(
        f"Machine: {env.get('cpus')} CPUs, {env.get('mem_gib')} GiB, Linux "
        f"{env.get('kernel')}. SQLite {env['sqlite']}: one file per peer, WAL, "
        f"synchronous={env['synchronous']}."
    )
    if cfg:
        out.append(
            f"Workloads: W1 = {cfg['w1_n']:,} single enqueues (bulk: batches of "
            f"{cfg['bulk_batch']}); W2 = drain {cfg['w2_n']:,} pre-enqueued jobs with total "
            f"concurrency {cfg['concurrency']}; W3 = {cfg['w3_n']} jobs enqueued "
            f"{cfg['w3_gap_s'] * 1000:.0f} ms apart to idle workers. Medians of up to "
            f"{cfg['reps']} runs."
        )
    out += [
        "",
        "| peer | version | "
        + " | ".join(f[2] for f in FIGURES)
        + " | jobs run W2 / W3 | W2 duplicates |",
        "|---|---|" + "---:|" * len(FIGURES) + "---:|---:|",
    ]
    for name, p in peers.items():
        version = (p.get("versions") or {}).get(MAIN_PACKAGE.get(name, name), "?")
        cells = [fmt(med(p, w, k), d) for w, k, _, d, _ in FIGURES]
        out.append(f"| {name} | {version} | " + " | ".join(cells) + f" | {delivery(p)} |")
    if MAIN in peers and len(peers) > 1:
        cells = [ratio_cell(peers, med, w, k, hi) for w, k, _, _, hi in FIGURES]
        out.append(f"| **{MAIN} ÷ best peer** | | " + " | ".join(cells) + " | | |")
    out += [
        "",
        f"Ratio row: {MAIN}'s figure divided by the best other peer's (named). Jobs/s: "
        "above 1 is faster. Seconds and latencies: below 1 is faster. W2 drain jobs/s = "
        "jobs / (first job start .. last job end), from the jobs' own records; W3 latency = "
        "job start - producer clock just before the enqueue call. '–' = no batch API, or "
        "failed (see notes).",
        "",
        "## CPU per job (ms)",
        "",
        "| peer | W1 single: producer | W1 bulk: producer | W2 machine busy % | "
        "W2 workers | W2 driver | W2 other |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in peers.items():
        cells = [
            fmt(med(p, "w1_single", "cpu_ms_per_job_producer"), 3),
            fmt(med(p, "w1_bulk", "cpu_ms_per_job_producer"), 3),
            fmt(med(p, "w2_drain", "machine_busy_pct")),
            fmt(med(p, "w2_drain", "cpu_ms_per_job_workers"), 2),
            fmt(med(p, "w2_drain", "cpu_ms_per_job_driver"), 2),
            fmt(med(p, "w2_drain", "cpu_ms_per_job_other"), 2),
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "SQLite runs inside the producer and the workers, so its work is in their columns. "
        "W2 from 10 % to 100 % of the drain; 2 CPUs busy = 200 %.",
        "",
        "## Per peer",
        "",
    ]
    for name, p in peers.items():
        versions = ", ".join(f"{k} {v}" for k, v in (p.get("versions") or {}).items())
        out.append(f"### {name}")
        out.append(f"- versions: {versions}; Python {p.get('python')}")
        out.append(f"- workers: {p.get('worker_note') or '?'}")
        out.append(f"- bulk enqueue: {p.get('bulk_note') or 'no batch API'}")
        out.append(
            f"- driver time {p.get('elapsed_s')} s (setup {p.get('setup_s')} s); "
            f"worker log lines with 'database is locked': {p['locked_lines']}"
        )
        for wname, w in (p.get("workloads") or {}).items():
            for r in w.get("runs", []):
                if "error" in r:
                    out.append(f"- {wname} run {r.get('rep')}: {r['error']}")
        for e in p.get("errors", []):
            out.append(f"- error: `{e.strip().splitlines()[-1][:300]}`")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--common", required=True, help="the shared harness's common/")
    ap.add_argument("--order", default="")
    args = ap.parse_args()
    sys.path.insert(0, args.common)
    import report  # the shared harness's: environment(), fmt(), med()

    peers = load(args.raw, args.order.split(","))
    for name, p in peers.items():
        p["locked_lines"] = locked_lines(args.logs, name)
    env = report.environment(argparse.Namespace(pg_port=None))
    env.update(
        sqlite=sqlite3.sqlite_version,
        synchronous=os.environ.get("BENCH_SQLITE_SYNCHRONOUS", "NORMAL"),
    )
    res = {
        "environment": env,
        "config": next((p["config"] for p in peers.values() if p.get("config")), None),
        "peers": peers,
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=2)
    text = markdown(res, report)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
