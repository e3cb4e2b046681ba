"""Lateness: events scheduled slightly ahead at a steady rate; due -> handler start, p50 / p99.

Times: schedule_on is database time, the handler sees wall time. Both clocks are the same machine's,
but the offset (database minus wall, from a round trip's midpoint) is measured and subtracted anyway.
"""

from __future__ import annotations

import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import baseline
from bench.harness import QUEUE, Context, Row, clock_offset, median, percentile, say, store_for
from bench.harness import wait_until_drained as drained
from bench.procs import WorkerSpec, read_seen, running, tickler_workers
from tickler.scheduler.models import NewEvent

LEAD = 0.25  # seconds ahead each event is scheduled
TICK = 0.01
P50_TARGET, P99_TARGET = 10.0, 50.0


def produce(rate: float, seconds: float, insert: Callable[[list[str]], None], prefix: str) -> float:
    """Insert at `rate`/s for `seconds`, every TICK; return the rate achieved."""
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(rate * elapsed) - sent
        if due > 0:
            insert([f"{prefix}{sent + i}" for i in range(due)])
            sent += due
        time.sleep(max(0.0, TICK - (time.monotonic() - started - elapsed)))
    return sent / (time.monotonic() - started)


def tickler_lateness(
    url: str,
    rate: float,
    seconds: float,
    prefix: str,
    *,
    room: dict[str, int] | None = None,
    on_workers: Callable[[list[int]], None] | None = None,
) -> tuple[list[tuple[float, float]], float]:
    """Run one tickler worker (in-process handler recording wall time) under the producer;
    return [(schedule_on epoch, lateness seconds)] and the achieved rate. `on_workers` gets the
    worker's pid once it is ready (a CPU meter counting it)."""
    offset = clock_offset(url)
    with tempfile.TemporaryDirectory() as tmp, store_for(url) as store:
        out = Path(tmp) / "seen.bin"
        spec = WorkerSpec(url, QUEUE, 100, mode="record", out_path=str(out), **(room or {}))  # type: ignore[arg-type]
        queue = store.queues.get(QUEUE)

        def insert(keys: list[str]) -> None:
            events = [NewEvent(item_key=k, data={}, delay_seconds=LEAD) for k in keys]
            store.events.schedule_batch(queue, events, actor="bench")

        with tickler_workers([spec]) as procs:
            if on_workers:
                on_workers([p.pid for p in procs if p.pid])
            achieved = produce(rate, seconds, insert, prefix)
            drained(url)
        seen = read_seen(str(out))
    return [(due, wall + offset - due) for wall, due in seen], achieved


def _baseline_worker(url: str, out_path: str, ready: Any, stop: Any) -> None:
    seen = array("d")  # the lateness of each delivery, s
    with baseline.connect(url) as conn:
        ready.set()
        while not stop.is_set():
            rows = baseline.claim(conn, QUEUE, "late", 100)
            if rows:
                now = time.time()
                seen.extend(now - row[2].timestamp() for row in rows)  # type: ignore[attr-defined]
                baseline.complete(conn, [int(row[0]) for row in rows])  # type: ignore[call-overload]
                continue
            wait = baseline.next_due_in(conn, QUEUE)
            time.sleep(min(0.05, max(0.0005, wait)) if wait is not None else 0.05)
    Path(out_path).write_bytes(seen.tobytes())


def baseline_lateness(
    url: str, rate: float, seconds: float, prefix: str, *, on_workers: Callable[[list[int]], None] | None = None
) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seen.bin"
        with running(_baseline_worker, [(url, str(out))], what="baseline worker", settle=0) as procs:
            if on_workers:
                on_workers([p.pid for p in procs if p.pid])
            with baseline.connect(url, autocommit=False) as conn:
                produce(rate, seconds, lambda keys: baseline.insert_copy(conn, QUEUE, keys, delay=LEAD), prefix)
            drained(url, table="bench_job")
        return array("d", out.read_bytes()).tolist()


def _at_most(limit: float) -> Callable[[float, float | None], bool]:
    return lambda tickler, _baseline: tickler <= limit


# The worker as `tickler worker` runs it, and with room for a whole batch of 100 in flight.
CONFIGS: tuple[tuple[str, dict[str, int]], ...] = (
    ("defaults: batch 100, 96 threads, 64 in flight per queue", {}),
    ("batch 100, 100 in flight per queue", {"concurrency": 100, "queue_concurrency": 100}),
)


def run(ctx: Context) -> list[Row]:
    rate, seconds = ctx.size(200, 2_000), ctx.size(2, 60)
    warmup = 1.0 if ctx.quick else 5.0
    rows = []
    bp50s: list[float] = []  # the baseline's, measured beside the first configuration
    bp99s: list[float] = []
    for label, room in CONFIGS[: 1 if ctx.quick else 2]:
        p50s, p99s, rates = [], [], []
        for r in range(ctx.repeats):
            with ctx.shared_database() as url:
                seen, achieved = tickler_lateness(url, rate, seconds, f"r{r}-", room=room)
                first = min(due for due, _ in seen)
                late = [lag * 1000 for due, lag in seen if due - first >= warmup]
                p50s.append(percentile(late, 50))
                p99s.append(percentile(late, 99))
                rates.append(achieved)
                if len(bp50s) < ctx.repeats:
                    base = baseline_lateness(url, rate, seconds, f"b{r}-")
                    cut = int(len(base) * warmup / seconds)
                    bp50s.append(percentile([x * 1000 for x in base[cut:]], 50))
                    bp99s.append(percentile([x * 1000 for x in base[cut:]], 99))
            say(
                f"lateness ({label}) run {r}: tickler p50 {p50s[-1]:.1f} ms p99 {p99s[-1]:.1f} ms at "
                f"{achieved:,.0f}/s; baseline p50 {bp50s[-1]:.1f} ms p99 {bp99s[-1]:.1f} ms"
            )
        name = f"lateness due→handler at {median(rates):,.0f} events/s for {seconds} s, 1 worker ({label})"
        for p, runs, base, limit in (("p50", p50s, bp50s, P50_TARGET), ("p99", p99s, bp99s, P99_TARGET)):
            met = _at_most(limit)
            rows.append(Row.measured(f"{name}: {p}", runs, base, unit="ms", target=f"{p} ≤ {limit:g} ms", met=met))
    return rows
