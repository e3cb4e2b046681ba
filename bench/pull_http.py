"""Pull consumers over HTTP: 4 processes claiming 100 at a time and acking them with one batch ack,
beside the same round trips in plain SQL (claim 100, then one completing UPDATE for the batch)."""

from __future__ import annotations

import time
from typing import Any

from bench import baseline
from bench.harness import QUEUE, Context, Row, admin_token
from bench.http import Client, gunicorn
from bench.procs import baseline_fill, fill_tickler, race

CONSUMERS = 4
LIMIT = 100
TARGET = 10_000


def _consumer(port: int, token: str, name: str, go: Any, out: Any) -> None:
    client = Client(port, token)
    go.wait()
    done = 0
    while True:
        status, body = client.post(f"/v1/queues/{QUEUE}/claims", {"worker": name, "limit": LIMIT})
        assert status == 200, status
        if not body["leases"]:
            break
        status, acked = client.post("/v1/leases/ack", {"lease_ids": [lease["lease_id"] for lease in body["leases"]]})
        assert status == 200, status
        assert all(result["status"] == "delivered" for result in acked["results"])
        done += sum(len(lease["events"]) for lease in body["leases"])
    out.put((time.time(), done))


def _baseline_consumer(url: str, go: Any, out: Any) -> None:
    with baseline.connect(url) as conn:
        go.wait()
        done = 0
        while rows := baseline.claim(conn, QUEUE, "pull", LIMIT):
            baseline.complete(conn, [int(row[0]) for row in rows])  # type: ignore[call-overload]
            done += len(rows)
    out.put((time.time(), done))


def _race(target: Any, args_of: Any, n: int) -> float:
    started, results = race(target, [args_of(c) for c in range(CONSUMERS)])
    done = sum(d for _, d in results)
    if done != n:
        raise RuntimeError(f"consumers finished {done} events of {n}")
    return float(n / (max(t for t, _ in results) - started))


def run(ctx: Context) -> list[Row]:
    n = ctx.size(400, 4_000)
    with ctx.shared_database() as url:
        token = admin_token(url)
        runs = []
        with gunicorn(url) as (port, _):
            for r in range(ctx.repeats):
                fill_tickler(url, n, delay_seconds=-1)
                runs.append(_race(_consumer, lambda c, r=r: (port, token, f"c{r}{c}"), n))
        base_runs = []
        for _ in range(ctx.repeats):
            baseline_fill(url, n)
            base_runs.append(_race(_baseline_consumer, lambda c: (url,), n))
    name = f"pull consumers over HTTP, {CONSUMERS} consumers, claim {LIMIT} / batch ack"
    return [Row.measured(name, runs, base_runs, target="≥ 10,000/s with 4 consumers", met=lambda t, _: t >= TARGET)]
