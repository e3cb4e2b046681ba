"""Scaling curves: schedule via HTTP with 1, 2, 4 API processes; claim+deliver+finish with 1, 2, 4
worker processes. Beside each point: speed-up over one process, efficiency (speed-up / processes)
and CPU per event; and, per delivered event, the WAL, commits and stored bytes that
docs/scaling.md multiplies out to 1,000,000,000 events a day (bench/scaling_doc.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg

from bench import baseline, schedule_http
from bench.cpu import CpuMeter
from bench.drain import baseline_fill, fill_tickler, finish_time, make_due_soon
from bench.harness import QUEUE, Context, Row, admin_token, make_queue, median, median_cpu, say, wait_until_drained
from bench.http import api_server
from bench.procs import WorkerSpec, baseline_drain, tickler_workers

PROCESSES = (1, 2, 4)
HTTP_CLIENTS = 8  # more than the largest server, so that the server side is what varies
THREADS = 4
BATCH = 100
ROOM = {"concurrency": 100, "queue_concurrency": 100}


def _counters(url: str) -> tuple[int, int, int]:
    """(WAL insert position in bytes, commits in this database, database size in bytes)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, "
            "(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), "
            "pg_database_size(current_database())"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _point(name: str, rates: list[float], cpus: list[list[float]]) -> Row:
    return Row(name, median(rates), None, "events/s", "-", None, runs=rates, cpu={"tickler": median_cpu(cpus)})


def _curve(points: list[tuple[int, Row]]) -> list[Row]:
    """Note each point's speed-up over the 1-process point and its efficiency (speed-up / processes)."""
    one = points[0][1].tickler if points else None
    for processes, row in points:
        speedup = (row.tickler or 0.0) / one if one else 1.0
        row.note = f"speed-up {speedup:.2f}x over 1 process, efficiency {speedup / processes:.2f}"
        say(f"{row.scenario}: {row.tickler or 0:,.0f}/s ({row.note})")
    return [row for _, row in points]


def _databases(ctx: Context) -> Iterator[tuple[int, str]]:
    """(processes, a fresh database with the bench queue) for each point of a curve."""
    for processes in PROCESSES[:1] if ctx.quick else PROCESSES:
        with ctx.database() as url:
            make_queue(url)
            yield processes, url


def _http_curve(ctx: Context) -> list[Row]:
    total = ctx.size(40, 4_000)
    points: list[tuple[int, Row]] = []
    for processes, url in _databases(ctx):
        token = admin_token(url)
        with api_server(url, "gunicorn", workers=processes, threads=THREADS) as (port, pid):
            rates, cpus = schedule_http.measured_runs(url, port, pid, token, total, ctx.repeats, 0, HTTP_CLIENTS)
        name = (
            f"scaling: schedule via HTTP, 1 event/request, {HTTP_CLIENTS} clients, "
            f"{processes} API process(es) (gunicorn gthread, {THREADS} threads each)"
        )
        points.append((processes, _point(name, rates, cpus)))
    return _curve(points)


def _drain_curve(ctx: Context) -> list[Row]:
    n = ctx.size(300, 30_000)
    points: list[tuple[int, Row]] = []
    costs: list[Row] = []
    for processes, url in _databases(ctx):
        baseline.install(url)
        specs = [WorkerSpec(url, QUEUE, BATCH, name=f"w{i}", **ROOM) for i in range(processes)]  # type: ignore[arg-type]
        rates, cpus, per_event = [], [], []
        with tickler_workers(specs) as procs:
            for _ in range(ctx.repeats):
                wal0, _, size0 = _counters(url)
                fill_tickler(url, n)
                wal1, commits1, size1 = _counters(url)
                with CpuMeter(url, [p.pid for p in procs if p.pid]) as meter:
                    due = make_due_soon(url)
                    wait_until_drained(url)
                wal2, commits2, _ = _counters(url)
                rates.append(n / (finish_time(url) - due))
                cpus.append(meter.use.per_event_us(n))
                per_event.append(((wal1 - wal0) / n, (wal2 - wal1) / n, (commits2 - commits1) / n, (size1 - size0) / n))
        base_rates = []
        for _ in range(ctx.repeats):
            baseline_fill(url, n)
            seconds, _cpu = baseline_drain(url, QUEUE, workers=processes, batch=BATCH)
            base_rates.append(n / seconds)
        name = f"scaling: claim+deliver+finish, no-op handler, batch {BATCH}, {processes} worker process(es)"
        row = _point(name, rates, cpus)
        row.baseline, row.baseline_runs = median(base_rates), base_rates
        points.append((processes, row))
        if processes == 1:  # what one event costs the primary, from the 1-worker drains
            for index, (label, unit) in enumerate(
                (
                    ("WAL written per scheduled event (batches of 10,000)", "bytes"),
                    ("WAL written per delivered event (claim + finish)", "bytes"),
                    ("commits per delivered event (batch 100)", "commits"),
                    ("database growth per scheduled event (table, timeline, indexes)", "bytes"),
                )
            ):
                values = [p[index] for p in per_event]
                costs.append(Row(f"scaling: {label}", median(values), None, unit, "-", None, runs=values))
    return [*_curve(points), *costs]


def run(ctx: Context) -> list[Row]:
    # quick: the drain curve's first point (the HTTP curve measures as schedule_http does)
    return [*([] if ctx.quick else _http_curve(ctx)), *_drain_curve(ctx)]
