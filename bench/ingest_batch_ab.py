"""HTTP batches with and without COPY into a staging table (migration 0066), beside the COPY
baseline, interleaved in one run.

    .venv/bin/python -m bench.ingest_batch_ab --sizes 1000,10000 --rounds 5

One database on a private cluster (bench/cluster.py settings) or --database-url; two API servers
on it, as the ingest scenario runs them (gunicorn gthread, 2 workers x 4 threads): A with
TICKLER_BATCH_COPY_MIN_EVENTS=0 (every batch as one jsonb parameter, as before), B with the default
(a batch of 200 or more by COPY). Per round and batch size: A, B and the baseline
(bench/baseline.py: COPY into a temporary table, INSERT ... ON CONFLICT) one after the other, each
with its events/s and CPU per event (the server's processes and the database's backends, /proc;
the baseline's application is this process). Prints the medians and each run, with the load
average, for bench/analysis.md "HTTP batches by COPY into a staging table".
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench import baseline, schedule_batch
from bench.cluster import PrivateCluster
from bench.cpu import CpuMeter
from bench.harness import admin_token, create_database, drop_database, make_queue
from bench.http import Client, api_server
from tickler.scheduler.migrate import migrate

WORKERS, THREADS = 2, 4


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000, help="events per timed run")
    parser.add_argument("--database-url", help="an admin URL of a server to use instead of a private cluster")
    args = parser.parse_args()
    cluster = None if args.database_url else PrivateCluster()
    admin = args.database_url or cluster.start()  # type: ignore[union-attr]
    url = create_database(admin)
    try:
        migrate(url)
        make_queue(url)
        baseline.install(url)
        token = admin_token(url)
        sides = {"A jsonb": {"TICKLER_BATCH_COPY_MIN_EVENTS": "0"}, "B COPY": {}}
        with (
            api_server(url, "gunicorn", workers=WORKERS, threads=THREADS, env=sides["A jsonb"]) as (port_a, pid_a),
            api_server(url, "gunicorn", workers=WORKERS, threads=THREADS, env=sides["B COPY"]) as (port_b, pid_b),
        ):
            servers = {"A jsonb": (Client(port_a, token), pid_a), "B COPY": (Client(port_b, token), pid_b)}
            tag = 0
            for size in (int(s) for s in args.sizes.split(",")):
                batches = max(1, args.events // size)
                for client, _ in servers.values():
                    for _ in range(WORKERS * 2):  # both workers of each server, warm (pools, plans)
                        tag += 1
                        schedule_batch.http_rate(client, size, 1, tag)
                rates: dict[str, list[float]] = {name: [] for name in (*servers, "baseline")}
                cpus: dict[str, list[list[float]]] = {name: [] for name in rates}
                loads = []
                for _ in range(args.rounds):
                    loads.append(loadavg())
                    for name, (client, pid) in servers.items():
                        tag += 1
                        with CpuMeter(url, [pid]) as meter:
                            rates[name].append(schedule_batch.http_rate(client, size, batches, tag))
                        cpus[name].append(meter.use.per_event_us(size * batches))
                    tag += 1
                    with CpuMeter(url, [], in_process=True) as meter:
                        rates["baseline"].append(schedule_batch.baseline_rate(url, size, batches, tag))
                    cpus["baseline"].append(meter.use.per_event_us(size * batches))
                base = statistics.median(rates["baseline"])
                print(f"\n## batch of {size:,} ({batches} per run, {args.rounds} rounds; load {', '.join(loads)})")
                print("| side | events/s (median) | / COPY | app µs/event | db µs/event | runs |")
                print("|---|---:|---:|---:|---:|---|")
                for name, runs in rates.items():
                    app = statistics.median(c[0] for c in cpus[name])
                    db = statistics.median(c[1] for c in cpus[name])
                    med = statistics.median(runs)
                    shown = ", ".join(f"{r:,.0f}" for r in runs)
                    print(f"| {name} | {med:,.0f} | {med / base:.2f} | {app:.1f} | {db:.1f} | {shown} |", flush=True)
            print(f"\nload average at the end: {loadavg()}")
            time.sleep(0.1)
    finally:
        drop_database(admin, url)
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
