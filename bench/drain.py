"""Fill a queue, make it all due at one instant, and time how long the workers take to finish it."""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg

from bench import baseline
from bench.cpu import HARNESS, CpuMeter, CpuUse
from bench.harness import QUEUE, finish_time, store_for, wait_until_drained
from tickler.scheduler.models import NewEvent

_counter = [0]
# The payload of the peers' shape: a number and 64 characters (bench/peers.py).
PAD = "x" * 64


def padded(n: int) -> dict[str, object]:
    return {"i": n, "pad": PAD}


def _keys(n: int) -> list[str]:
    start = _counter[0]
    _counter[0] += n
    return [f"k{start + i}" for i in range(n)]


def fill_tickler(url: str, n: int, *, groups: int = 0, delay_seconds: float = 3600.0, pad: bool = False) -> None:
    """Schedule `n` events (an hour ahead by default) through the store, 10,000 per statement;
    pad: the data is padded(i) instead of {"n": key}."""
    store = store_for(url, pool_size=1)
    queue = store.queues.get(QUEUE)
    keys = _keys(n)
    try:
        for start in range(0, n, 10_000):
            chunk = keys[start : start + 10_000]
            events = [
                NewEvent(
                    item_key=key,
                    data=padded(start + i) if pad else {"n": key},
                    delay_seconds=delay_seconds,
                    group_key=f"g{(start + i) % groups}" if groups else None,
                )
                for i, key in enumerate(chunk)
            ]
            store.events.schedule_batch(queue, events, actor="bench")
    finally:
        store.engine.dispose()


def make_due_soon(url: str, *, lead: float = 0.3, table: str = "tickler_event") -> float:
    """Move every open event to `lead` seconds from now (one instant) and wake the dispatchers, as a
    writer would; return that instant (database clock, epoch seconds)."""
    with psycopg.connect(url, application_name=HARNESS) as conn:
        row = conn.execute("SELECT extract(epoch FROM now() + make_interval(secs => %s))::float8", (lead,)).fetchone()
        assert row is not None
        due = float(row[0])
        conn.execute(
            f"UPDATE {table} SET schedule_on = to_timestamp(%s) WHERE dequeued_on IS NULL",
            (due,),
        )
        if table == "tickler_event":
            conn.execute("SELECT pg_notify('tickler_wake', %s)", (QUEUE,))
    return due


def tickler_rate(url: str, n: int, *, groups: int = 0) -> float:
    """Events/s for running workers to claim, deliver and finish `n` events that fall due together."""
    return tickler_drain(url, n, [], groups=groups)[0]


def tickler_drain(url: str, n: int, pids: Sequence[int], *, groups: int = 0, pad: bool = False) -> tuple[float, CpuUse]:
    """tickler_rate, and the CPU the worker processes `pids` and the database spent draining."""
    fill_tickler(url, n, groups=groups, pad=pad)
    with CpuMeter(url, pids) as meter:
        due = make_due_soon(url)
        wait_until_drained(url)
    return n / (finish_time(url) - due), meter.use


def baseline_fill(url: str, n: int, *, groups: int = 0, delay: float = 0.0, pad: bool = False) -> None:
    keys = _keys(n)
    with baseline.connect(url, autocommit=False) as conn:
        for start in range(0, n, 10_000):
            chunk = keys[start : start + 10_000]
            group_keys = [f"g{(start + i) % groups}" for i in range(len(chunk))] if groups else None
            data = [json.dumps(padded(start + i)) for i in range(len(chunk))] if pad else None
            baseline.insert_copy(conn, QUEUE, chunk, delay=delay, groups=group_keys, data=data)
