"""Worker processes for the scenarios (tickler's Worker with a no-op handler, and the baseline loop),
and the drains they run: fill a queue, make it all due at one instant, and time how long the
workers take to finish it.

Processes are spawned (not forked), so none inherits the parent's connections or threads.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psycopg

from bench import baseline
from bench.cpu import HARNESS, CpuMeter, CpuUse, SelfCpu
from bench.harness import QUEUE, finish_time, store_for, wait_until_drained
from tickler.scheduler.models import NewEvent

SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    queue: str
    batch: int
    mode: str = "noop"  # noop | group | webhook | record
    out_path: str = ""
    # None: the dispatcher's defaults (DispatcherConfig)
    concurrency: int | None = None
    queue_concurrency: int | None = None
    name: str = "w"


def batch_workers(url: str, workers: int, batch: int, *, room: bool = True) -> list[WorkerSpec]:
    """No-op workers claiming `batch` at a time, with room for a whole batch (the dispatcher claims
    min(batch, free slots)), or the dispatcher's defaults when not `room`."""
    wide = {"concurrency": max(96, batch), "queue_concurrency": max(64, batch)} if room else {}
    return [WorkerSpec(url, QUEUE, batch, name=f"w{i}", **wide) for i in range(workers)]  # type: ignore[arg-type]


def _tickler_worker(spec: WorkerSpec, ready: Any, stop: Any) -> None:
    from tickler.config import Settings
    from tickler.scheduler.delivery.handlers import Handlers
    from tickler.scheduler.logs import configure_logging
    from tickler.scheduler.worker import Worker

    configure_logging("WARNING")
    handlers = Handlers()
    seen = array("d")  # (wall time, due time) of each delivery, flat: quick to write however many
    if spec.mode == "group":
        handlers.group_handler(spec.queue)(lambda events: None)
    elif spec.mode == "record":
        handlers.handler(spec.queue)(lambda event: seen.extend((time.time(), event.schedule_on.timestamp())))
    elif spec.mode == "noop":
        handlers.handler(spec.queue)(lambda event: None)
    # the concurrency settings the spec names; the dispatcher's defaults for the others
    room = {"concurrency": spec.concurrency, "queue_concurrency": spec.queue_concurrency}
    worker = Worker(
        handlers,
        settings=Settings(database_url=spec.url, migrate_on_start=False, log_level="WARNING"),
        database_url=spec.url,
        name=spec.name,
        deliver_webhooks=spec.mode == "webhook",
        batch_size=spec.batch,
        **{k: v for k, v in room.items() if v is not None},
    )
    worker.start()
    ready.set()
    stop.wait()
    worker.stop()
    if spec.out_path:
        Path(spec.out_path).write_bytes(seen.tobytes())


def read_seen(path: str) -> list[tuple[float, float]]:
    """What a `record` worker wrote: [(wall time, due time)] per delivered event."""
    flat = array("d", Path(path).read_bytes())
    return list(zip(flat[0::2], flat[1::2], strict=True))


@contextmanager
def tickler_workers(specs: list[WorkerSpec], *, settle: float = 0.5) -> Iterator[Sequence[BaseProcess]]:
    """Run tickler workers (one process each) for the duration of the block; they are ready (LISTENing)
    when it starts and stopped gracefully when it ends."""
    # settle: its claim loop has looked once and gone to sleep
    with running(_tickler_worker, [(spec,) for spec in specs], what="tickler worker", settle=settle) as procs:
        yield procs


@contextmanager
def running(
    target: Callable[..., None], args: Sequence[tuple[Any, ...]], *, what: str, settle: float
) -> Iterator[list[BaseProcess]]:
    """One spawned process per args tuple, called as target(*args, ready, stop): it sets `ready`
    once it serves, and ends gracefully when `stop` is set (at the end of the block)."""
    stop = SPAWN.Event()
    readies = [SPAWN.Event() for _ in args]
    procs = [
        SPAWN.Process(target=target, args=(*a, ready, stop), daemon=True)
        for a, ready in zip(args, readies, strict=True)
    ]
    for proc in procs:
        proc.start()
    try:
        for ready in readies:
            if not ready.wait(60):
                raise RuntimeError(f"a {what} did not start")
        time.sleep(settle)
        yield procs
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def _baseline_worker(url: str, queue: str, batch: int, group: bool, go: Any, done: Any) -> None:
    with baseline.connect(url) as conn:
        go.wait()
        cpu = SelfCpu(conn.info.backend_pid)
        claim = baseline.claim_groups if group else baseline.claim
        while rows := claim(conn, queue, "base", batch):
            # the handler would run here (a no-op)
            baseline.complete(conn, [int(row[0]) for row in rows])  # type: ignore[call-overload]
        done.put((time.time(), cpu.spent()))


def baseline_drain(url: str, queue: str, *, workers: int, batch: int, group: bool = False) -> tuple[float, CpuUse]:
    """Drain the baseline table with `workers` processes; return the seconds it took (go to last
    finish) and the CPU the workers and their backends spent."""
    started, results = race(_baseline_worker, [(url, queue, batch, group) for _ in range(workers)])
    return float(max(t for t, _ in results)) - started, CpuUse.total(c for _, c in results)


class Go:
    """The start line: each process calls wait() once, ready (connected, imports done); race()
    releases them together when all have arrived, so no process's start-up is timed."""

    def __init__(self) -> None:
        self.arrived = SPAWN.Semaphore(0)
        self.event = SPAWN.Event()

    def wait(self) -> None:
        self.arrived.release()
        self.event.wait()


def race(target: Callable[..., None], args: Sequence[tuple[Any, ...]]) -> tuple[float, list[Any]]:
    """Start one spawned process per args tuple, release them all at once, and return the release
    time and what each put on its queue. `target` takes (*args, go, out): it waits for `go`, does
    its work, then puts one result on `out` (by convention starting with its finish time)."""
    go = Go()
    out: multiprocessing.Queue[Any] = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*a, go, out)) for a in args]
    for proc in procs:
        proc.start()
    for _ in procs:  # every one started, connected and waiting on `go`
        if not go.arrived.acquire(timeout=300):
            raise RuntimeError("a load process did not reach the start line")
    time.sleep(0.05)  # the last one is inside event.wait()
    started = time.time()
    go.event.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(10)
    return started, results


# -- the drains ---------------------------------------------------------------------------------------

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
    events = [
        NewEvent(
            item_key=key,
            data=padded(i) if pad else {"n": key},
            delay_seconds=delay_seconds,
            group_key=f"g{i % groups}" if groups else None,
        )
        for i, key in enumerate(_keys(n))
    ]
    with store_for(url) as store:
        queue = store.queues.get(QUEUE)
        for start in range(0, n, 10_000):
            store.events.schedule_batch(queue, events[start : start + 10_000], actor="bench")


def make_due_soon(
    url: str, *, lead: float = 0.3, table: str = "tickler_event", column: str = "schedule_on", where: str = ""
) -> float:
    """Move every open row of `table` (`where`, if not every row without dequeued_on) to `lead`
    seconds from now, one instant, and wake the workers as a writer would (pgqueuer's own change
    trigger wakes its workers on the UPDATE); return that instant (database clock, epoch seconds)."""
    with psycopg.connect(url, application_name=HARNESS) as conn:
        row = conn.execute("SELECT extract(epoch FROM now() + make_interval(secs => %s))::float8", (lead,)).fetchone()
        assert row is not None
        due = float(row[0])
        conn.execute(f"UPDATE {table} SET {column} = to_timestamp(%s) WHERE {where or 'dequeued_on IS NULL'}", (due,))
        if table == "tickler_event":
            conn.execute("SELECT pg_notify('tickler_wake', %s)", (QUEUE,))
    return due


def tickler_rate(url: str, n: int, *, groups: int = 0) -> float:
    """Events/s for running workers to claim, deliver and finish `n` events that fall due together."""
    return tickler_drain(url, n, [], groups=groups)[0]


def tickler_drain(
    url: str, n: int, pids: Sequence[int], *, groups: int = 0, pad: bool = False
) -> tuple[float, list[float]]:
    """tickler_rate, and the CPU µs per event [app, db] the worker processes `pids` and the database
    spent draining."""
    fill_tickler(url, n, groups=groups, pad=pad)
    with CpuMeter(url, pids) as meter:
        due = make_due_soon(url)
        wait_until_drained(url)
    return n / (finish_time(url) - due), meter.use.per_event_us(n)


def baseline_drain_rate(
    url: str, n: int, *, workers: int, batch: int, groups: int = 0, pad: bool = False
) -> tuple[float, list[float]]:
    """Events/s for `workers` baseline processes to claim (whole groups when there are `groups`) and
    complete `n` due jobs, and the CPU µs per event [app, db] they and their backends spent."""
    baseline_fill(url, n, groups=groups, pad=pad)
    seconds, cpu = baseline_drain(url, QUEUE, workers=workers, batch=batch, group=bool(groups))
    return n / seconds, cpu.per_event_us(n)


def baseline_fill(url: str, n: int, *, groups: int = 0, delay: float = 0.0, pad: bool = False) -> None:
    keys = _keys(n)
    with baseline.connect(url, autocommit=False) as conn:
        for start in range(0, n, 10_000):
            chunk = keys[start : start + 10_000]
            group_keys = [f"g{(start + i) % groups}" for i in range(len(chunk))] if groups else None
            data = [json.dumps(padded(start + i)) for i in range(len(chunk))] if pad else None
            baseline.insert_copy(conn, QUEUE, chunk, delay=delay, groups=group_keys, data=data)
