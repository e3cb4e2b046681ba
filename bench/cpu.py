"""CPU time per event: the application's processes and the PostgreSQL backends serving them.

A meter samples, every SAMPLE seconds, the user + system CPU of
- the application: the processes it was given (and their descendants, e.g. gunicorn's workers),
  and this process when the work runs in-process;
- the database: every backend connected to the measured database (pg_stat_activity), read from
  /proc/<pid>/stat, which works because the server runs on this machine.
It keeps the last value seen per pid, so processes and connections that start and end within the
window count (from 0 when first seen after the start), losing at most one interval of CPU each.
Load generators (HTTP clients, the producer of the lateness scenario) are not given to it.

What else runs on a shared box moves the rates of a run: LoadSampler samples the 1-minute load
average while a scenario runs, and the report states the range, so that no one has to add it to
docs/benchmarks.md by hand.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import psycopg

SAMPLE = 0.2
# The harness's own short connections (polling for the end of a drain, reading the finish time)
# carry this application_name and are not counted.
HARNESS = "tickler-bench-harness"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Sampler:
    """Sampling in the background while a `with` block runs: once on entering, every `interval`
    seconds from a daemon thread, and once more on leaving (so that the last stretch counts).
    A subclass says what one sample is (`sample`); `lost` are the errors after which the
    background thread stops sampling (the samples on entering and leaving still raise them)."""

    lost: tuple[type[Exception], ...] = ()

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def sample(self, *, first: bool = False) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except self.lost:
                return

    def __enter__(self) -> Self:
        self.sample(first=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def proc_cpu(pid: int) -> float | None:
    """utime + stime of one process, in seconds (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            kids = [int(p) for p in children.read().split()]
    except OSError:
        return []
    return kids + [grandchild for kid in kids for grandchild in _children(kid)]


@dataclass
class CpuUse:
    app: float  # seconds
    db: float

    def per_event_us(self, events: int) -> list[float]:
        """[app, db] in µs per event."""
        return [self.app / events * 1e6, self.db / events * 1e6]

    @staticmethod
    def total(uses: Iterable[CpuUse]) -> CpuUse:
        listed = list(uses)
        return CpuUse(sum(use.app for use in listed), sum(use.db for use in listed))


class SelfCpu:
    """A process measuring itself (all its threads) and its own database backends, from now on:
    for short-lived load processes whose start-up (imports) must not count."""

    def __init__(self, *backend_pids: int) -> None:
        self.backends = backend_pids
        self.app = time.process_time()
        self.db = [proc_cpu(pid) or 0.0 for pid in backend_pids]

    def spent(self) -> CpuUse:
        db = sum((proc_cpu(pid) or before) - before for pid, before in zip(self.backends, self.db, strict=True))
        return CpuUse(time.process_time() - self.app, db)


class CpuMeter(Sampler):
    """with CpuMeter(url, pids) as meter: ...work...; meter.use -> CpuUse."""

    lost = (psycopg.Error,)  # the database went away: the samples so far stand

    def __init__(self, url: str, pids: Iterable[int] = (), *, in_process: bool = False) -> None:
        self.url = url
        self.roots = list(pids)
        self.in_process = in_process
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._db_pids: set[int] = set()
        super().__init__(SAMPLE, "cpu-meter")
        self._conn: psycopg.Connection | None = None
        self.use = CpuUse(0.0, 0.0)

    def add(self, pids: Iterable[int]) -> None:
        """More application processes, started after the meter and ready now: counted from now on
        (their start-up, imports included, is not)."""
        for root in pids:
            self.roots.append(root)
            for pid in (root, *_children(root)):
                value = proc_cpu(pid)
                if value is not None:
                    self._first[pid] = self._last[pid] = value

    def _app_pids(self) -> set[int]:
        pids = {p for root in self.roots for p in (root, *_children(root))}
        if self.in_process:
            pids.add(os.getpid())
        return pids

    def sample(self, *, first: bool = False) -> None:
        assert self._conn is not None
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name IS DISTINCT FROM %s",
            (HARNESS,),
        ).fetchall()
        backends = {int(r[0]) for r in rows}
        self._db_pids |= backends
        for pid in self._app_pids() | backends:
            value = proc_cpu(pid)
            if value is None:
                continue
            self._first.setdefault(pid, value if first else 0.0)
            self._last[pid] = value

    def __enter__(self) -> Self:
        self._conn = psycopg.connect(self.url, autocommit=True)
        return super().__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            super().__exit__(kind, error, trace)
        finally:
            assert self._conn is not None
            self._conn.close()
        spent = {pid: max(0.0, last - self._first.get(pid, 0.0)) for pid, last in self._last.items()}
        app = sum(cpu for pid, cpu in spent.items() if pid not in self._db_pids)
        self.use = CpuUse(app, sum(cpu for pid, cpu in spent.items() if pid in self._db_pids))


def available() -> bool:
    """Per-process CPU comes from /proc: Linux, and a server on this machine."""
    return os.path.exists(f"/proc/{os.getpid()}/stat")


class LoadSampler(Sampler):
    """`with LoadSampler() as load: ...` then `load.range()`: (lowest, highest) 1-minute load average."""

    def __init__(self, interval: float = 5.0) -> None:
        super().__init__(interval, "bench-load")
        self.samples: list[float] = []

    def sample(self, *, first: bool = False) -> None:
        self.samples.append(os.getloadavg()[0])

    def range(self) -> tuple[float, float]:
        return (min(self.samples), max(self.samples)) if self.samples else (0.0, 0.0)
