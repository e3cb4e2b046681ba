"""Worker processes for the scenarios: tickler's Worker with a no-op handler, and the baseline loop.

Processes are spawned (not forked), so none inherits the parent's connections or threads.
"""

from __future__ import annotations

import multiprocessing
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from bench.cpu import CpuUse

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


def _room(spec: WorkerSpec) -> dict[str, Any]:
    """The concurrency settings the spec names; the dispatcher's defaults for the others."""
    room: dict[str, Any] = {}
    if spec.concurrency is not None:
        room["concurrency"] = spec.concurrency
    if spec.queue_concurrency is not None:
        room["queue_concurrency"] = spec.queue_concurrency
    return room


def _tickler_worker(spec: WorkerSpec, ready: Any, stop: Any) -> None:
    from tickler.config import Settings
    from tickler.scheduler.delivery.handlers import Handlers
    from tickler.scheduler.logs import configure_logging
    from tickler.scheduler.models import Event
    from tickler.scheduler.worker import Worker

    configure_logging("WARNING")
    handlers = Handlers()
    seen = array("d")  # (wall time, due time) of each delivery, flat: quick to write however many
    if spec.mode == "group":
        handlers.group_handler(spec.queue)(lambda events: None)
    elif spec.mode == "record":

        def record(event: Event) -> None:
            seen.extend((time.time(), event.schedule_on.timestamp()))

        handlers.handler(spec.queue)(record)
    elif spec.mode == "noop":
        handlers.handler(spec.queue)(lambda event: None)
    worker = Worker(
        handlers,
        settings=Settings(database_url=spec.url, migrate_on_start=False, log_level="WARNING"),
        database_url=spec.url,
        name=spec.name,
        deliver_webhooks=spec.mode == "webhook",
        batch_size=spec.batch,
        **_room(spec),
    )
    worker.start()
    ready.set()
    stop.wait()
    worker.stop()
    if spec.out_path:
        with open(spec.out_path, "wb") as out:
            seen.tofile(out)


def read_seen(path: str) -> list[tuple[float, float]]:
    """What a `record` worker wrote: [(wall time, due time)] per delivered event."""
    flat = array("d")
    with open(path, "rb") as f:
        flat.frombytes(f.read())
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
    from bench import baseline
    from bench.cpu import SelfCpu

    with baseline.connect(url) as conn:
        go.wait()
        cpu = SelfCpu(conn.info.backend_pid)
        while True:
            if group:
                rows = baseline.claim_groups(conn, queue, "base", batch)
            else:
                rows = baseline.claim(conn, queue, "base", batch)
            if not rows:
                break
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

    def wait(self, timeout: float | None = None) -> bool:
        self.arrived.release()
        return self.event.wait(timeout)


def race(
    target: Callable[..., None], args: Sequence[tuple[Any, ...]], *, on_start: Callable[[list[int]], None] | None = None
) -> tuple[float, list[Any]]:
    """Start one spawned process per args tuple, release them all at once, and return the release
    time and what each put on its queue. `target` takes (*args, go, out): it waits for `go`, does
    its work, then puts one result on `out` (by convention starting with its finish time).
    `on_start` gets the processes' pids once they run (a CPU meter counting them)."""
    go = Go()
    out: multiprocessing.Queue[Any] = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*a, go, out)) for a in args]
    for proc in procs:
        proc.start()
    if on_start:
        on_start([p.pid for p in procs if p.pid is not None])
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
