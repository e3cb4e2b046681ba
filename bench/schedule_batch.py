"""Schedule via HTTP in batches of 1,000 and 10,000, beside COPY -> INSERT ... ON CONFLICT."""

from __future__ import annotations

import time

from bench import baseline
from bench.cpu import CpuMeter
from bench.harness import QUEUE, Context, Row, admin_token, make_queue, median_cpu
from bench.http import Client, api_server

TARGET = 0.5


def http_rate(client: Client, batch: int, batches: int, round_: int) -> float:
    bodies = [
        {"events": [{"item_key": f"r{round_}-{j}-{i}", "delay_seconds": 3600, "data": {"n": i}} for i in range(batch)]}
        for j in range(batches)
    ]
    started = time.perf_counter()
    for body in bodies:
        status, answer = client.post(f"/v1/queues/{QUEUE}/events/batch", body)
        if status != 200 or any(r["outcome"] != "created" for r in answer["results"]):
            raise RuntimeError(f"batch failed: {status}")
    return batch * batches / (time.perf_counter() - started)


def baseline_rate(url: str, batch: int, batches: int, round_: int) -> float:
    keys = [[f"b{round_}-{j}-{i}" for i in range(batch)] for j in range(batches)]
    with baseline.connect(url, autocommit=False) as conn:
        started = time.perf_counter()
        for chunk in keys:
            baseline.insert_copy(conn, QUEUE, chunk, delay=3600)
        return batch * batches / (time.perf_counter() - started)


def run(ctx: Context) -> list[Row]:
    rows = []
    for batch, batches in ((ctx.size(100, 1_000), ctx.size(3, 30)), (ctx.size(1_000, 10_000), ctx.size(2, 5))):
        with ctx.database() as url:
            make_queue(url)
            baseline.install(url)
            token = admin_token(url)
            base_runs = [baseline_rate(url, batch, batches, r) for r in range(ctx.repeats)]
            runs, cpus = [], []
            with api_server(url, "gunicorn") as (port, pid):
                client = Client(port, token)
                http_rate(client, batch, 1, -1)  # warm-up
                for r in range(ctx.repeats):
                    with CpuMeter(url, [pid]) as meter:  # the server and the database; not the client
                        runs.append(http_rate(client, batch, batches, r))
                    cpus.append(meter.use.per_event_us(batch * batches))
        name = f"schedule via HTTP batch of {batch:,}, 1 client"
        target = "≥ 50% of COPY→INSERT ON CONFLICT"
        rows.append(Row.throughput(name, runs, base_runs, target, TARGET, cpu={"tickler": median_cpu(cpus)}))
    return rows
