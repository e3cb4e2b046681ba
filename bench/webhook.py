"""Webhook delivery to a local no-op receiver, one tickler worker, beside a plain loop that claims 100,
POSTs each event signed (keep-alive) and completes the batch."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import time

from bench import baseline
from bench.drain import baseline_fill, tickler_rate
from bench.harness import QUEUE, Context, Row, make_queue
from bench.http import free_port
from bench.procs import SPAWN, WorkerSpec, tickler_workers
from bench.receiver import serve

TARGET = 2_000
BATCH = 100


def baseline_rate(url: str, port: int, n: int) -> float:
    secret = b"bench-secret"
    conn = http.client.HTTPConnection("127.0.0.1", port)
    with baseline.connect(url) as db:
        started = time.perf_counter()
        while rows := baseline.claim(db, QUEUE, "hook", BATCH):
            for row in rows:
                body = json.dumps(
                    {
                        "queue": QUEUE,
                        "events": [{"id": row[0], "item_key": row[1], "schedule_on": str(row[2]), "data": row[3]}],
                    }
                ).encode()
                stamp = str(int(time.time()))
                signature = base64.b64encode(
                    hmac.new(secret, f"msg_{row[0]}.{stamp}.".encode() + body, hashlib.sha256).digest()
                ).decode()
                conn.request(
                    "POST",
                    "/hook",
                    body=body,
                    headers={
                        "Content-Type": "application/json",
                        "webhook-id": f"msg_{row[0]}",
                        "webhook-timestamp": stamp,
                        "webhook-signature": f"v1,{signature}",
                    },
                )
                response = conn.getresponse()
                response.read()
                assert response.status == 204
            baseline.complete(db, [int(row[0]) for row in rows])  # type: ignore[call-overload]
        return n / (time.perf_counter() - started)


def run(ctx: Context) -> list[Row]:
    n = ctx.size(300, 10_000)
    port = free_port()
    ready = SPAWN.Event()
    receiver = SPAWN.Process(target=serve, args=(port, ready), daemon=True)
    receiver.start()
    rows = []
    try:
        if not ready.wait(30):
            raise RuntimeError("the receiver did not start")
        configs: tuple[tuple[str, dict[str, int]], ...] = (
            ("defaults: 96 threads, 64 per queue", {}),
            ("128 threads, 100 per queue", {"concurrency": 128, "queue_concurrency": 100}),
        )
        for label, room in configs[: 1 if ctx.quick else 2]:
            with ctx.database() as url:
                make_queue(url, delivery_mode="webhook", webhook_url=f"http://127.0.0.1:{port}/hook")
                baseline.install(url)
                spec = WorkerSpec(url, QUEUE, BATCH, mode="webhook", **room)  # type: ignore[arg-type]
                with tickler_workers([spec]):
                    runs = [tickler_rate(url, n) for _ in range(ctx.repeats)]
                base_runs = []
                for _ in range(ctx.repeats):
                    baseline_fill(url, n)
                    base_runs.append(baseline_rate(url, port, n))
            name = f"webhook delivery to a local no-op receiver, 1 worker, batch {BATCH} ({label})"
            rows.append(Row.measured(name, runs, base_runs, target="≥ 2,000 events/s", met=lambda t, _: t >= TARGET))
    finally:
        receiver.terminate()
        receiver.join(5)
    return rows
