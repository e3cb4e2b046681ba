"""Webhook delivery, one tickler worker with its defaults, beside a baseline deliverer: a plain asyncio
loop that claims rows, POSTs each signed (aiohttp, keep-alive) and completes them.

1. To a local no-op receiver: events/s, tickler against the baseline (target ≥ 0.6x).
2. To a receiver that answers after 250 ms, 3,000 events due at once, the queue's max_in_flight
   2,000: deliveries/s (target ≥ 2,000), the most requests the receiver held at once, and the
   worker's peak RSS (target ≤ 300 MiB)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp

from bench import baseline
from bench.drain import baseline_fill, tickler_rate
from bench.harness import QUEUE, Context, Row, make_queue, say
from bench.http import free_port
from bench.procs import SPAWN, WorkerSpec, tickler_workers
from bench.receiver import serve

TARGET = 2_000
BATCH = 100
SLOW = 0.25
SECRET = b"bench-secret"


def _post(http: aiohttp.ClientSession, url: str, row: tuple[Any, ...]) -> Any:
    body = json.dumps(
        {"queue": QUEUE, "events": [{"id": row[0], "item_key": row[1], "schedule_on": str(row[2]), "data": row[3]}]}
    ).encode()
    stamp = str(int(time.time()))
    mac = hmac.new(SECRET, f"msg_{row[0]}.{stamp}.".encode() + body, hashlib.sha256).digest()
    headers = {
        "Content-Type": "application/json",
        "webhook-id": f"msg_{row[0]}",
        "webhook-timestamp": stamp,
        "webhook-signature": f"v1,{base64.b64encode(mac).decode()}",
    }
    return http.post(url, data=body, headers=headers)


async def _baseline(db_url: str, url: str, n: int, window: int) -> float:
    """Claim up to BATCH rows while fewer than `window` requests are in flight, POST each, and
    complete the ones answered in one statement after each wait."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def deliver(row: tuple[Any, ...]) -> int:
            async with _post(http, url, row) as response:
                await response.read()
                assert response.status == 204
            return int(row[0])

        with baseline.connect(db_url) as db:
            started = time.perf_counter()
            tasks: set[asyncio.Task[int]] = set()
            while True:
                free = window - len(tasks)
                rows = baseline.claim(db, QUEUE, "hook", min(BATCH, free)) if free > 0 else []
                tasks.update(asyncio.create_task(deliver(row)) for row in rows)
                if not tasks:
                    break
                if rows and len(tasks) < window:
                    await asyncio.sleep(0)  # let the requests go out before the next claim
                    continue
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                baseline.complete(db, [task.result() for task in done])
        return n / (time.perf_counter() - started)


@contextmanager
def _receiver(delay: float) -> Iterator[tuple[int, Any]]:
    port, ready, gauge = free_port(), SPAWN.Event(), SPAWN.Array("q", 2, lock=False)
    receiver = SPAWN.Process(target=serve, args=(port, ready, delay, gauge), daemon=True)
    receiver.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the receiver did not start")
        yield port, gauge
    finally:
        receiver.terminate()
        receiver.join(5)


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(ctx: Context) -> list[Row]:
    rows = []
    n = ctx.size(300, 10_000)
    with _receiver(0.0) as (port, _):
        url = f"http://127.0.0.1:{port}/hook"
        with ctx.database() as db_url:
            make_queue(db_url, delivery_mode="webhook", webhook_url=url)
            baseline.install(db_url)
            with tickler_workers([WorkerSpec(db_url, QUEUE, BATCH, mode="webhook")]):
                runs = [tickler_rate(db_url, n) for _ in range(ctx.repeats)]
            base_runs = []
            for _ in range(ctx.repeats):
                baseline_fill(db_url, n)
                base_runs.append(asyncio.run(_baseline(db_url, url, n, 1000)))
        name = "webhook delivery to a local no-op receiver, 1 worker (defaults)"
        rows.append(Row.measured(name, runs, base_runs, target="≥ 0.6x baseline", met=lambda t, b: t >= 0.6 * (b or 0)))
    n = ctx.size(3_000, 6_000)
    with _receiver(SLOW) as (port, gauge):
        url = f"http://127.0.0.1:{port}/hook"
        with ctx.database() as db_url:
            make_queue(db_url, delivery_mode="webhook", webhook_url=url, max_in_flight=2000)
            baseline.install(db_url)
            with tickler_workers([WorkerSpec(db_url, QUEUE, BATCH, mode="webhook")]) as procs:
                runs, peaks, rss = [], [], []
                for _ in range(ctx.repeats):
                    gauge[1] = 0
                    runs.append(tickler_rate(db_url, n))
                    peaks.append(gauge[1])
                    rss.append(_peak_rss_mib(procs[0].pid or 0))
            base_runs, base_peaks = [], []
            for _ in range(ctx.repeats):
                gauge[1] = 0
                baseline_fill(db_url, n)
                base_runs.append(asyncio.run(_baseline(db_url, url, n, 2000)))
                base_peaks.append(gauge[1])
        say(f"250 ms receiver: most held at once tickler {peaks}, baseline {base_peaks}; worker peak RSS {rss} MiB")
        name = f"webhook delivery to a 250 ms receiver, {n:,} due at once, 1 worker (defaults), max_in_flight 2,000"
        row = Row.measured(name, runs, base_runs, target=f"≥ {TARGET:,} events/s", met=lambda t, _: t >= TARGET)
        row.note = f"most in flight {max(peaks)}; worker peak RSS {max(rss):.0f} MiB (≤ 300)"
        rows.append(row)
    return rows
