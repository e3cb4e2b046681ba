"""The harness: the PostgreSQL server, a fresh database per scenario, repeats and medians, result rows."""

from __future__ import annotations

import contextlib
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from bench import baseline
from bench.cpu import HARNESS
from tickler.config import Settings
from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.migrate import migrate
from tickler.scheduler.store import QueueSettings, Store

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"


@dataclass
class Row:
    """One line of a results table: tickler's median beside the baseline's (and the peer's), same unit."""

    scenario: str
    tickler: float | None
    baseline: float | None
    unit: str
    target: str
    met: bool | None
    note: str = ""
    runs: list[float] = field(default_factory=list)
    baseline_runs: list[float] = field(default_factory=list)
    # The peer (pgqueuer) doing the same work in the same run; None: no equivalent, or not installed.
    peer: float | None = None
    peer_runs: list[float] = field(default_factory=list)
    # Further peers doing the same work (by name: "awa-pg"), each with its median and its runs.
    others: dict[str, float] = field(default_factory=dict)
    others_runs: dict[str, list[float]] = field(default_factory=dict)
    # CPU µs per event, [application, database], per side ("tickler", "peer", "baseline").
    cpu: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return None if self.tickler is None or not self.baseline else self.tickler / self.baseline

    @classmethod
    def measured(
        cls,
        name: str,
        runs: list[float],
        baseline_runs: list[float],
        *,
        unit: str = "events/s",
        target: str = "-",
        met: Callable[[float, float | None], bool] | None = None,
        cpu: dict[str, list[float]] | None = None,
    ) -> Row:
        """A row of repeated measurements: the medians of both sides; `met(tickler, baseline)` says
        whether the target holds (None: the row states a figure, no target)."""
        t, b = median(runs), median(baseline_runs) if baseline_runs else None
        say(f"{name}: tickler {t:,.1f}, baseline {b or 0:,.1f} {unit} ({runs} / {baseline_runs})")
        ok = None if met is None else met(t, b)
        return cls(name, t, b, unit, target, ok, runs=runs, baseline_runs=baseline_runs, cpu=cpu or {})


def at_least(share: float) -> Callable[[float, float | None], bool]:
    """The target of a rate against the baseline's: met at `share` of it."""
    return lambda tickler, base: tickler >= share * (base or 0)


@dataclass
class Context:
    """What every scenario gets: the server and the sizes to use."""

    admin_url: str
    quick: bool
    repeats: int

    def size(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    @contextlib.contextmanager
    def shared_database(self, **settings: Any) -> Iterator[str]:
        """A fresh database for tickler and the baseline: the queue QUEUE (with `settings`) and the
        baseline's table."""
        with database(self.admin_url) as url:
            make_queue(url, **settings)
            baseline.install(url)
            yield url

    def repeat(
        self, measure: Callable[..., tuple[float, list[float]]], *args: Any, **kwargs: Any
    ) -> tuple[list[float], list[list[float]]]:
        """measure(*args, **kwargs) `repeats` times, each a figure and its CPU µs/event: the figures, the CPUs."""
        measured = [measure(*args, **kwargs) for _ in range(self.repeats)]
        return [figure for figure, _ in measured], [cpu for _, cpu in measured]


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def median_cpu(per_run: list[list[float]]) -> list[float]:
    """[app, db] µs/event: the median of each over the repeats (none without repeats)."""
    return [median(list(side)) for side in zip(*per_run, strict=True)]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


# -- the server -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_database(url: str, name: str) -> str:
    return make_url(libpq_url(url)).set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def database(admin_url: str, *, tickler: bool = True) -> Iterator[str]:
    """A fresh database (migrated for tickler when asked), dropped afterwards; yields its libpq URL."""
    admin_url, name = libpq_url(admin_url), f"tickler_bench_{uuid.uuid4().hex[:10]}"
    execute(admin_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        if tickler:
            migrate(with_database(admin_url, name))
        yield with_database(admin_url, name)
    finally:
        execute(admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def execute(url: str, *statements: str | sql.Composable) -> None:
    """Statements on a fresh autocommit connection of the harness's own."""
    with psycopg.connect(url, autocommit=True, application_name=HARNESS) as conn:
        for statement in statements:
            conn.execute(statement)


def value(url: str, query: str | sql.Composable, params: Any = ()) -> Any:
    """The one value a query returns, on a fresh connection of the harness's own (not metered; no
    stale statistics snapshot)."""
    with psycopg.connect(url, autocommit=True, application_name=HARNESS) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def poll(done: Callable[[], object], *, what: str, timeout: float = 600.0, interval: float = 0.1) -> None:
    """Call `done` every `interval` s until it returns something true; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout} s")
        time.sleep(interval)


# -- tickler state ----------------------------------------------------------------------------------


@contextlib.contextmanager
def store_for(url: str, pool_size: int = 1) -> Iterator[Store]:
    store = Store(create_engine(url, pool_size=pool_size))
    try:
        yield store
    finally:
        store.engine.dispose()


def make_queue(url: str, name: str = QUEUE, **settings: Any) -> None:
    """Create a queue through the store (the same path as PUT /v1/queues/{q})."""
    with store_for(url) as store:
        store.queues.put(name, QueueSettings(**settings), Settings())


def admin_token(url: str) -> str:
    with store_for(url) as store:
        return store.tokens.create("bench", is_admin=True)


def wait_until_drained(url: str, *, table: str = "tickler_event", timeout: float = 600.0) -> None:
    """Poll (slowly: the end time is read from dequeued_on, not from this loop) until nothing is open."""
    query = sql.SQL("SELECT count(*) = 0 FROM {} WHERE dequeued_on IS NULL").format(sql.Identifier(table))
    poll(lambda: value(url, query), what=f"{table}: events still open", timeout=timeout)


def finish_time(url: str, table: str = "tickler_event") -> float:
    """Epoch seconds of the last finish (database clock)."""
    # tickler's finished events are in its history (migration 0021): read every event
    table = "tickler_event_all" if table == "tickler_event" else table
    query = sql.SQL("SELECT extract(epoch FROM max(dequeued_on))::float8 FROM {}").format(sql.Identifier(table))
    return float(value(url, query))


def clock_offset(url: str) -> float:
    """database clock minus this process's time.time(), from the quickest round trip's midpoint."""
    samples = []
    with psycopg.connect(url) as conn:
        for _ in range(5):
            before = time.time()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            after = time.time()
            assert row is not None
            samples.append((after - before, float(row[0]) - (before + after) / 2))
    return min(samples)[1]
