"""Schedule via HTTP in batches of 1,000 and 10,000, beside COPY -> INSERT ... ON CONFLICT."""

from __future__ import annotations

import time

from bench import baseline
from bench.harness import QUEUE, Context, Row, admin_token, make_queue, median, say
from bench.http import Client, gunicorn

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
            with gunicorn(url) as port:
                client = Client(port, token)
                http_rate(client, batch, 1, -1)  # warm-up
                runs = [http_rate(client, batch, batches, r) for r in range(ctx.repeats)]
        t, b = median(runs), median(base_runs)
        name = f"schedule via HTTP batch of {batch:,}, 1 client"
        say(f"{name}: tickler {t:,.0f}/s, baseline {b:,.0f}/s ({runs} / {base_runs})")
        rows.append(
            Row(
                name,
                t,
                b,
                "events/s",
                "≥ 50% of COPY→INSERT ON CONFLICT",
                t >= TARGET * b,
                runs=runs,
                baseline_runs=base_runs,
            )
        )
    return rows
