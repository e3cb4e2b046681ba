"""The harness: the PostgreSQL server, a fresh database per scenario, repeats and medians, result rows."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.cpu import HARNESS
from tickler.scheduler.db import libpq_url
from tickler.scheduler.migrate import migrate
from tickler.scheduler.store import Store

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
        if self.tickler is None or not self.baseline:
            return None
        return self.tickler / self.baseline

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

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

    @classmethod
    def throughput(
        cls,
        name: str,
        runs: list[float],
        baseline_runs: list[float],
        target: str,
        share: float,
        cpu: dict[str, list[float]],
    ) -> Row:
        """An events/s row against the baseline, met at `share` of it."""
        return cls.measured(name, runs, baseline_runs, target=target, met=lambda t, b: t >= share * (b or 0), cpu=cpu)


@dataclass
class Context:
    """What every scenario gets: the server and the sizes to use."""

    admin_url: str
    quick: bool
    repeats: int

    def size(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    @contextlib.contextmanager
    def database(self, *, tickler: bool = True) -> Iterator[str]:
        """A fresh database (migrated for tickler when asked), dropped afterwards; yields its libpq URL."""
        url = create_database(self.admin_url)
        try:
            if tickler:
                migrate(url)
            yield url
        finally:
            drop_database(self.admin_url, url)


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def median_cpu(per_run: list[list[float]]) -> list[float]:
    """[app, db] µs/event: the median of each over the repeats."""
    if not per_run:
        return []
    return [median([run[0] for run in per_run]), median([run[1] for run in per_run])]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


# -- the server -------------------------------------------------------------------------------------

_embedded: list[Any] = []


def resolve_server(url: str | None) -> str:
    """The admin URL of the target server: the one given, the local PostgreSQL, or an embedded one."""
    candidate = url or os.environ.get("TICKLER_BENCH_DATABASE_URL") or DEFAULT_URL
    try:
        with psycopg.connect(libpq_url(candidate), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return libpq_url(candidate)
    except psycopg.OperationalError:
        if url:
            raise
    say(f"{candidate} is not reachable: starting an embedded PostgreSQL (pgserver)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(ROOT / ".tickler-bench" / "pgdata", cleanup_mode="stop")
    _embedded.append(server)
    with psycopg.connect(str(server.get_uri()), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_connections = 200")
    return str(server.get_uri())


def create_database(admin_url: str) -> str:
    name = f"tickler_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(admin_url, name)


def with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(libpq_url(url)).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, url: str) -> None:
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    assert name is not None
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# -- tickler state ----------------------------------------------------------------------------------


def store_for(url: str, pool_size: int = 4) -> Store:
    from tickler.scheduler.db import create_engine

    return Store(create_engine(url, pool_size=pool_size))


def make_queue(url: str, name: str = QUEUE, **settings: Any) -> None:
    """Create a queue through the store (the same path as PUT /v1/queues/{q})."""
    from tickler.config import Settings
    from tickler.scheduler.store import QueueSettings

    store = store_for(url, pool_size=1)
    try:
        store.queues.put(name, QueueSettings(**settings), Settings())
    finally:
        store.engine.dispose()


def admin_token(url: str) -> str:
    store = store_for(url, pool_size=1)
    try:
        return store.tokens.create("bench", is_admin=True)
    finally:
        store.engine.dispose()


def open_count(url: str, table: str = "tickler_event") -> int:
    with psycopg.connect(url, application_name=HARNESS) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE dequeued_on IS NULL").format(sql.Identifier(table))
        ).fetchone()
    return int(row[0]) if row else 0


def wait_until_drained(url: str, *, table: str = "tickler_event", timeout: float = 600.0) -> None:
    """Poll (slowly: the end time is read from dequeued_on, not from this loop) until nothing is open."""
    deadline = time.monotonic() + timeout
    while open_count(url, table) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{table}: events still open after {timeout} s")
        time.sleep(0.1)


def finish_time(url: str, table: str = "tickler_event") -> float:
    """Epoch seconds of the last finish (database clock)."""
    # tickler's finished events are in its history (migration 0021): read every event
    table = "tickler_event_all" if table == "tickler_event" else table
    with psycopg.connect(url, application_name=HARNESS) as conn:
        row = conn.execute(
            sql.SQL("SELECT extract(epoch FROM max(dequeued_on))::float8 FROM {}").format(sql.Identifier(table))
        ).fetchone()
    assert row is not None and row[0] is not None
    return float(row[0])


def clock_offset(url: str) -> float:
    """database clock minus this process's time.time(), from the round trip's midpoint."""
    with psycopg.connect(url) as conn:
        best: tuple[float, float] | None = None
        for _ in range(5):
            before = time.time()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            after = time.time()
            assert row is not None
            sample = (after - before, float(row[0]) - (before + after) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
    assert best is not None
    return best[1]
