"""Worker processes for the scenarios: tickler's Worker with a no-op handler, and the baseline loop.

Processes are spawned (not forked), so none inherits the parent's connections or threads.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

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
    from config import Settings
    from scheduler.delivery.handlers import Handlers
    from scheduler.logs import configure_logging
    from scheduler.models import Event
    from scheduler.worker import Worker

    configure_logging("WARNING")
    handlers = Handlers()
    seen: list[tuple[float, float]] = []
    if spec.mode == "group":
        handlers.group_handler(spec.queue)(lambda events: None)
    elif spec.mode == "record":

        def record(event: Event) -> None:
            seen.append((time.time(), event.schedule_on.timestamp()))

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
        with open(spec.out_path, "w") as out:
            json.dump(seen, out)


@contextmanager
def tickler_workers(specs: list[WorkerSpec], *, settle: float = 0.5) -> Iterator[Sequence[BaseProcess]]:
    """Run tickler workers (one process each) for the duration of the block; they are ready (LISTENing)
    when it starts and stopped gracefully when it ends."""
    stop = SPAWN.Event()
    readies = [SPAWN.Event() for _ in specs]
    procs = [
        SPAWN.Process(target=_tickler_worker, args=(spec, ready, stop), daemon=True)
        for spec, ready in zip(specs, readies, strict=True)
    ]
    for proc in procs:
        proc.start()
    try:
        for ready in readies:
            if not ready.wait(60):
                raise RuntimeError("a tickler worker did not start")
        time.sleep(settle)  # its claim loop has looked once and gone to sleep
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

    with baseline.connect(url) as conn:
        go.wait()
        while True:
            if group:
                rows = baseline.claim_groups(conn, queue, "base", batch)
            else:
                rows = baseline.claim(conn, queue, "base", batch)
            if not rows:
                break
            # the handler would run here (a no-op)
            baseline.complete(conn, [int(row[0]) for row in rows])  # type: ignore[call-overload]
    done.put(time.time())


def run_baseline_workers(url: str, queue: str, *, workers: int, batch: int, group: bool = False) -> float:
    """Drain the baseline table with `workers` processes; return the seconds it took (go to last finish)."""
    started, finished = race(_baseline_worker, [(url, queue, batch, group) for _ in range(workers)])
    return float(max(finished)) - started


def race(target: Callable[..., None], args: Sequence[tuple[Any, ...]]) -> tuple[float, list[Any]]:
    """Start one spawned process per args tuple, release them all at once, and return the release
    time and what each put on its queue. `target` takes (*args, go, out): it waits for `go`, does
    its work, then puts one result on `out` (by convention starting with its finish time)."""
    go = SPAWN.Event()
    out: multiprocessing.Queue[Any] = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*a, go, out)) for a in args]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # started, connected and waiting on `go`
    started = time.time()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(10)
    return started, results
