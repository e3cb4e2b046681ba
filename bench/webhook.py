"""Webhook delivery, one tickler worker with its defaults, beside a baseline deliverer: a plain asyncio
loop that claims rows, POSTs each signed (aiohttp, keep-alive) and completes them.

1. To a local no-op receiver: events/s, tickler against the baseline (target ≥ 0.6x).
2. To a receiver that answers after 250 ms, 6,000 events due at once, the queue's max_in_flight
   2,000, delivered by `tickler serve` with its defaults (a dispatcher in each web process):
   deliveries/s (target ≥ 2,000), the most requests the receiver held at once, and the peak RSS of
   serve's processes together (target ≤ 300 MiB)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench import baseline
from bench.harness import QUEUE, ROOT, Context, Row, at_least, free_port, poll, say
from bench.http import ready as answering
from bench.procs import SPAWN, WorkerSpec, baseline_fill, running, tickler_rate, tickler_workers

TARGET = 2_000
BATCH = 100
SLOW = 0.25
SECRET = b"bench-secret"


class _Protocol(asyncio.Protocol):
    """A webhook receiver that cannot be the bottleneck: asyncio, keep-alive, answers 204 to every
    POST, after `delay` seconds (0: at once) without holding anything but a timer per request."""

    def __init__(self, delay: float, gauge: Any) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.delay = delay
        self.gauge = gauge  # [now, max] requests held, when counting

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = 0
            for line in self.buffer[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            if self.delay:
                self.gauge[0] += 1
                self.gauge[1] = max(self.gauge[1], self.gauge[0])
                asyncio.get_running_loop().call_later(self.delay, self._answer)
            else:
                self._answer()

    def _answer(self) -> None:
        if self.delay:
            self.gauge[0] -= 1
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")


def serve_receiver(port: int, delay: float, gauge: Any, ready: Any, stop: Any) -> None:
    """The receiver, as a process, until `stop`; `gauge`: a shared array of two ints, [held now,
    most held at once]."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Protocol(delay, gauge), "127.0.0.1", port, backlog=4096)
        ready.set()
        await asyncio.to_thread(stop.wait)
        server.close()

    asyncio.run(main())


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


def _peak_rss_mib(pids: list[int]) -> float:
    """The peak resident memory of these processes, added up."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            total += next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), 0)
    return total / 1024


def _family(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in _read_children(task)]
    return [pid, *(found for child in children for found in _family(child))]


def _read_children(task: Path) -> list[str]:
    try:
        return (task / "children").read_text().split()
    except OSError:
        return []


@contextmanager
def _serving(db_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """`tickler serve` with its defaults on a migrated database, answering, until the block ends."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICKLER_", "PROMETHEUS_"))}
    env |= {"TICKLER_DATABASE_URL": db_url, "TICKLER_MIGRATE_ON_START": "false", "TICKLER_LOG_LEVEL": "WARNING"}
    command = [str(ROOT / ".venv/bin/tickler"), "serve", "--port", str(port)]
    serve = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll(lambda: answering(port), what="tickler serve not answering", timeout=60)
        yield serve
    finally:
        serve.terminate()
        serve.wait(60)


def _measure(
    ctx: Context, delay: float, n: int, window: int, *, serve: bool = False, **queue: int
) -> tuple[list[Any], ...]:
    """To a receiver answering after `delay` s: the rates of tickler (one worker process, or
    `tickler serve` when `serve`) and of the baseline (`window` requests in flight at most), the
    most requests the receiver held at once with each, and tickler's peak RSS."""
    port, gauge = free_port(), SPAWN.Array("q", 2, lock=False)
    with running(serve_receiver, [(port, delay, gauge)], what="webhook receiver", settle=0):
        url = f"http://127.0.0.1:{port}/hook"
        with ctx.shared_database(delivery_mode="webhook", webhook_url=url, **queue) as db_url:
            delivering = (
                _serving(db_url) if serve else tickler_workers([WorkerSpec(db_url, QUEUE, BATCH, mode="webhook")])
            )
            with delivering as procs:
                pid = procs.pid if isinstance(procs, subprocess.Popen) else procs[0].pid or 0
                runs, peaks, rss = [], [], []
                for _ in range(ctx.repeats):
                    gauge[1] = 0
                    runs.append(tickler_rate(db_url, n))
                    peaks.append(gauge[1])
                    rss.append(_peak_rss_mib(_family(pid)))
            base_runs, base_peaks = [], []
            for _ in range(ctx.repeats):
                gauge[1] = 0
                baseline_fill(db_url, n)
                base_runs.append(asyncio.run(_baseline(db_url, url, n, window)))
                base_peaks.append(gauge[1])
    return runs, base_runs, peaks, base_peaks, rss


def run(ctx: Context) -> list[Row]:
    runs, base_runs, *_ = _measure(ctx, 0.0, ctx.size(300, 10_000), 1000)
    name = "webhook delivery to a local no-op receiver, 1 worker (defaults)"
    rows = [Row.measured(name, runs, base_runs, target="≥ 0.6x baseline", met=at_least(0.6))]
    n = ctx.size(3_000, 6_000)
    runs, base_runs, peaks, base_peaks, rss = _measure(ctx, SLOW, n, 2000, serve=True, max_in_flight=2000)
    say(f"250 ms receiver: most held at once tickler {peaks}, baseline {base_peaks}; serve's peak RSS {rss} MiB")
    name = f"webhook delivery to a 250 ms receiver, {n:,} due at once, `tickler serve` (defaults), max_in_flight 2,000"
    row = Row.measured(name, runs, base_runs, target=f"≥ {TARGET:,} events/s", met=lambda t, _: t >= TARGET)
    row.note = f"most in flight {max(peaks)}; serve's peak RSS, all processes {max(rss):.0f} MiB (≤ 300)"
    return [*rows, row]
