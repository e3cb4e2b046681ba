"""Schedule via HTTP, one event per request (gunicorn, 2 workers, keep-alive client processes),
beside single-row INSERTs on one connection."""

from __future__ import annotations

import time
from typing import Any

from bench import baseline
from bench.cpu import CpuMeter
from bench.harness import QUEUE, Context, Row, admin_token, at_least, median_cpu
from bench.http import Client, gunicorn
from bench.procs import race

TARGET = 0.4
CLIENTS = 4


def _client(port: int, token: str, prefix: str, count: int, go: Any, out: Any) -> None:
    client = Client(port, token)
    go.wait()
    failures = 0
    for i in range(count):
        status, _ = client.post(
            f"/v1/queues/{QUEUE}/events", {"item_key": f"{prefix}-{i}", "delay_seconds": 3600, "data": {"n": i}}
        )
        failures += status != 202
    out.put((time.time(), failures))


def http_rate(port: int, token: str, total: int, round_: int) -> float:
    per = total // CLIENTS
    started, results = race(_client, [(port, token, f"r{round_}c{c}", per) for c in range(CLIENTS)])
    failures = sum(f for _, f in results)
    if failures:
        raise RuntimeError(f"{failures} requests failed")
    return float(per * CLIENTS / (max(t for t, _ in results) - started))


def baseline_rate(url: str, total: int, round_: int) -> float:
    with baseline.connect(url) as conn:
        started = time.perf_counter()
        for i in range(total):
            baseline.insert_one(conn, QUEUE, f"b{round_}-{i}", delay=3600)
        return total / (time.perf_counter() - started)


def run(ctx: Context) -> list[Row]:
    total = ctx.size(200, 3_000)
    rows = []
    with ctx.shared_database() as url:
        token = admin_token(url)
        base_runs = [baseline_rate(url, total, r) for r in range(ctx.repeats)]
        configs = (("sync workers, as deployed", 0), ("gthread, 4 threads each: real keep-alive", 4))
        for label, threads in configs[: 1 if ctx.quick else 2]:
            runs, cpus = [], []
            with gunicorn(url, threads=threads) as (port, pid):
                http_rate(port, token, min(total, 400), -1 - threads)  # warm-up: pools, caches
                for r in range(ctx.repeats):
                    with CpuMeter(url, [pid]) as meter:  # the server (its workers) and the database
                        runs.append(http_rate(port, token, total, 10 * threads + r))
                    cpus.append(meter.use.per_event_us(total // CLIENTS * CLIENTS))
            name = f"schedule via HTTP, 1 event/request, gunicorn -w 2 ({label}), {CLIENTS} clients"
            met, cpu = at_least(TARGET), {"tickler": median_cpu(cpus)}
            rows.append(Row.measured(name, runs, base_runs, target="≥ 40% of single-row INSERT", met=met, cpu=cpu))
    return rows
