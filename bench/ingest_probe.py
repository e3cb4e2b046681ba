"""A quick probe of the single-event HTTP schedule: one server, N keep-alive clients, events/s, CPU
per event of the server and the database (/proc), each request's latency, and optionally a py-spy
profile of the server while it runs.

    .venv/bin/python -m bench.ingest_probe --server gunicorn --clients 4 --total 3000 [--py-spy out.txt]

It uses the PostgreSQL that bench uses (TICKLER_BENCH_DATABASE_URL, else 127.0.0.1:5432, else an
embedded one) with a fresh database, dropped afterwards. For profiling steps; the report's rows
come from `python -m bench --only ingest`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import CpuMeter
from bench.harness import QUEUE, admin_token, create_database, drop_database, make_queue, percentile, resolve_server
from bench.http import Client, api_server
from bench.procs import race
from tickler.scheduler.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]


def _client(port: int, token: str, prefix: str, count: int, go: Any, out: Any) -> None:
    client = Client(port, token)
    go.wait()
    failures = 0
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        status, _ = client.post(
            f"/v1/queues/{QUEUE}/events", {"item_key": f"{prefix}-{i}", "delay_seconds": 3600, "data": {"n": i}}
        )
        latencies.append(time.perf_counter() - started)
        failures += status != 202
    out.put((time.time(), failures, latencies))


def run_clients(port: int, token: str, total: int, clients: int, tag: str) -> tuple[float, list[float]]:
    """(events/s, every request's latency in seconds)."""
    per = total // clients
    started, results = race(_client, [(port, token, f"{tag}c{c}", per) for c in range(clients)])
    failures = sum(f for _, f, _ in results)
    if failures:
        raise RuntimeError(f"{failures} requests failed")
    return per * clients / (max(t for t, _, _ in results) - started), [x for _, _, lat in results for x in lat]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="gunicorn", choices=["gunicorn", "waitress", "granian"])
    parser.add_argument(
        "--app", default="lean", choices=["lean", "flask"], help="flask: without the lean single-event route"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--clients", type=int, nargs="+", default=[4])
    parser.add_argument("--total", type=int, default=3000)
    parser.add_argument("--group-commit-ms", help="TICKLER_GROUP_COMMIT_MS of the server (default: its own)")
    parser.add_argument("--py-spy", help="write a py-spy raw profile of the server here (first client count)")
    parser.add_argument(
        "--gil", action="store_true", help="py-spy samples only the thread holding the GIL (CPU, not waits)"
    )
    args = parser.parse_args()
    admin = resolve_server(None)
    url = create_database(admin)
    try:
        migrate(url)
        make_queue(url)
        token = admin_token(url)
        workers = 1 if args.server == "waitress" else args.workers
        threads = args.threads * (args.workers if args.server == "waitress" else 1)
        env = {"TICKLER_GROUP_COMMIT_MS": args.group_commit_ms} if args.group_commit_ms is not None else {}
        with api_server(url, args.server, workers=workers, threads=threads, env=env, app=args.app) as (port, pid):
            run_clients(port, token, 400, max(args.clients), "warm")
            for n, clients in enumerate(args.clients):
                spy = None
                if args.py_spy and n == 0:
                    spy = subprocess.Popen(
                        [
                            str(ROOT / ".venv/bin/py-spy"),
                            "record",
                            "--rate",
                            "200",
                            "--format",
                            "raw",
                            *(["--gil"] if args.gil else []),
                            "--subprocesses",
                            "-o",
                            args.py_spy,
                            "--pid",
                            str(pid),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)
                with CpuMeter(url, [pid]) as meter:
                    rate, latencies = run_clients(port, token, args.total, clients, f"m{n}")
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(30)
                app, db = meter.use.per_event_us(args.total // clients * clients)
                print(
                    f"{args.server} ({args.app}) {clients} clients: {rate:,.0f}/s  "
                    f"app {app:,.0f} µs  db {db:,.0f} µs/event  "
                    f"latency p50 {percentile(latencies, 50) * 1e3:.2f} ms p99 {percentile(latencies, 99) * 1e3:.2f} ms"
                    f"  load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*), count(DISTINCT enqueued_on) FROM tickler_event").fetchone()
            assert row is not None
            print(f"events per statement (group commit): {row[0] / max(1, row[1]):.2f}")
    finally:
        drop_database(admin, url)


if __name__ == "__main__":
    main()
