"""The ingest path (issue #24), every row in one run: single-event HTTP schedules under gunicorn
gthread at 1, 4 and 16 clients with group commit (TICKLER_GROUP_COMMIT_MS, default 2 ms) and at 4
without it, under waitress in one process and under `tickler serve` itself (its defaults: 2 web
processes); HTTP batches of 1,000 and 10,000; the in-process
enqueue beside pgqueuer's. The single-event rows at 4 clients also run without the lean route
(api/lean.py: every request through Flask) and under granian, to compare within the run.
Each against its plain-psycopg baseline in the same database, with the
CPU per event of the server's processes and the database (/proc) and, for single events, each
request's latency (p50 / p99, in the row's note). Derived rows restate the issue's targets from the
same run: the application's and PostgreSQL's CPU per single-event request (gunicorn, 4 clients),
`tickler serve` against gunicorn, and the latency each request pays for group commit (p50 and
p99 with it against without it, at 1, 4 and 16 clients)."""

from __future__ import annotations

import time
from typing import Any

from bench import baseline, pgq, schedule_batch, schedule_http
from bench.cpu import CpuMeter
from bench.harness import QUEUE, Context, Row, admin_token, make_queue, median, median_cpu, percentile, say
from bench.http import Client, api_server, server_available
from bench.peers import _enqueue_rate
from bench.procs import race

WORKERS, THREADS = 2, 4


def _client(port: int, token: str, prefix: str, count: int, go: Any, out: Any) -> None:
    client = Client(port, token)
    go.wait()
    failures, latencies = 0, []
    for i in range(count):
        started = time.perf_counter()
        status, _ = client.post(
            f"/v1/queues/{QUEUE}/events", {"item_key": f"{prefix}-{i}", "delay_seconds": 3600, "data": {"n": i}}
        )
        latencies.append(time.perf_counter() - started)
        failures += status != 202
    out.put((time.time(), failures, latencies))


def _single(port: int, pid: int, url: str, token: str, total: int, clients: int, round_: int) -> tuple[float, Any, Any]:
    """(events/s, [app, db] µs/event, latencies in s) of one timed run."""
    per = total // clients
    with CpuMeter(url, [pid]) as meter:
        started, results = race(_client, [(port, token, f"r{round_}c{c}", per) for c in range(clients)])
    if sum(f for _, f, _ in results):
        raise RuntimeError("requests failed")
    rate = per * clients / (max(t for t, _, _ in results) - started)
    return rate, meter.use.per_event_us(per * clients), [x for _, _, lat in results for x in lat]


def _single_row(
    label: str,
    kind: str,
    env: dict[str, str],
    clients: int,
    url: str,
    token: str,
    ctx: Context,
    base: list[float],
    n: int,
    app: str = "lean",
) -> tuple[Row, list[float]]:
    """Configuration number `n` of the run (its keys are its own: all share one database): its
    row, and every timed request's latency in seconds."""
    total = ctx.size(60, 3_000 if clients < 16 else 4_800)
    # waitress-serve: one process (serve before --web-processes); serve: its defaults (2 x 8 threads)
    workers, threads = {"waitress": (1, WORKERS * THREADS), "serve": (2, 8)}.get(kind, (WORKERS, THREADS))
    runs, cpus, latencies = [], [], []
    with api_server(url, kind, workers=workers, threads=threads, env=env, app=app) as (port, pid):
        _single(port, pid, url, token, min(total, 400), clients, 100 * n)  # warm-up: pools, prepared plans
        for r in range(ctx.repeats):
            rate, cpu, lat = _single(port, pid, url, token, total, clients, 100 * n + 1 + r)
            runs.append(rate)
            cpus.append(cpu)
            latencies += lat
    name = f"ingest: HTTP 1 event/request, {label}, {clients} client(s)"
    row = Row.throughput(name, runs, base, "≥ 40% of single-row INSERT (4 clients)", 0.4, {"tickler": median_cpu(cpus)})
    row.met = row.met if clients == 4 else None
    row.note = f"latency p50 {percentile(latencies, 50) * 1e3:.1f} ms, p99 {percentile(latencies, 99) * 1e3:.1f} ms"
    say(f"{name}: {row.note}")
    return row, latencies


def _cpu_rows(gthread: Row) -> list[Row]:
    """The CPU targets of a single-event request, from the gunicorn row at 4 clients."""
    app, db = gthread.cpu["tickler"]
    where = "gunicorn gthread, 4 clients, group commit 2 ms"
    return [
        Row(
            f"ingest: application CPU per single-event HTTP schedule, {where}",
            app,
            None,
            "µs/event",
            "≤ 700 µs",
            app <= 700,
        ),
        Row(
            f"ingest: PostgreSQL CPU per single-event HTTP schedule, {where}",
            db,
            None,
            "µs/event",
            "≤ 500 µs",
            db <= 500,
        ),
    ]


def _serve_row(serve: Row, gthread: Row) -> Row:
    """`tickler serve` (its defaults) against gunicorn gthread, single events, 4 clients."""
    assert serve.tickler is not None and gthread.tickler is not None
    ratio = serve.tickler / gthread.tickler
    return Row(
        "ingest: tickler serve (defaults) / gunicorn gthread, 1 event/request, 4 clients, group commit 2 ms",
        ratio,
        None,
        "x",
        "within 10 % of gunicorn",
        ratio >= 0.9,
        note=f"{serve.tickler:,.0f} / {gthread.tickler:,.0f} events/s",
    )


def _latency_rows(on: dict[int, list[float]], off: dict[int, list[float]]) -> list[Row]:
    """What a request pays for group commit: its latency with a 2 ms window (tickler column)
    against without one (baseline column), gunicorn gthread, per number of clients."""
    rows = []
    for clients in sorted(on.keys() & off.keys()):
        for p in (50, 99):
            with_, without = percentile(on[clients], p) * 1e3, percentile(off[clients], p) * 1e3
            rows.append(
                Row(
                    f"ingest: request latency p{p}, gunicorn gthread, {clients} client(s): group commit 2 ms "
                    "(baseline column: group commit off)",
                    with_,
                    without,
                    "ms",
                    "-",
                    None,
                )
            )
    return rows


def _batch_rows(ctx: Context) -> list[Row]:
    rows = []
    for batch, batches in ((1_000, ctx.size(2, 20)), (ctx.size(2_000, 10_000), ctx.size(1, 4))):
        with ctx.database() as url:
            make_queue(url)
            baseline.install(url)
            token = admin_token(url)
            base = [schedule_batch.baseline_rate(url, batch, batches, r) for r in range(ctx.repeats)]
            runs, cpus = [], []
            with api_server(url, "gunicorn", workers=WORKERS, threads=THREADS) as (port, pid):
                client = Client(port, token)
                schedule_batch.http_rate(client, batch, 1, 99)  # warm-up
                for r in range(ctx.repeats):
                    with CpuMeter(url, [pid]) as meter:
                        runs.append(schedule_batch.http_rate(client, batch, batches, 100 + r))
                    cpus.append(meter.use.per_event_us(batch * batches))
            name = f"ingest: HTTP batch of {batch:,}, gunicorn gthread, 1 client, vs COPY → INSERT ON CONFLICT"
            rows.append(Row.throughput(name, runs, base, "≥ 60% of COPY", 0.6, {"tickler": median_cpu(cpus)}))
    return rows


def _enqueue_row(ctx: Context) -> Row:
    total = ctx.size(40, 3_000)
    sides: dict[str, tuple[list[float], list[list[float]]]] = {}
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        for side in ("tickler", "baseline"):
            measured = [_enqueue_rate(side, url, 1, total) for _ in range(ctx.repeats)]
            sides[side] = ([m[0] for m in measured], [m[1] for m in measured])
    if pgq.available():
        with ctx.database(tickler=False) as url:
            pgq.install(url)
            measured = [_enqueue_rate("peer", url, 1, total) for _ in range(ctx.repeats)]
            sides["peer"] = ([m[0] for m in measured], [m[1] for m in measured])
    t, b, p = sides["tickler"], sides["baseline"], sides.get("peer")
    cpu = {side: median_cpu(cpus) for side, (_, cpus) in sides.items()}
    met = None if p is None else sum(cpu["tickler"]) <= sum(cpu["peer"])
    return Row(
        "ingest: in-process enqueue, 1 event/transaction, 1 client",
        median(t[0]),
        median(b[0]),
        "events/s",
        "CPU/event ≤ pgqueuer's",
        met,
        runs=t[0],
        baseline_runs=b[0],
        peer=median(p[0]) if p else None,
        peer_runs=p[0] if p else [],
        cpu=cpu,
    )


def run(ctx: Context) -> list[Row]:
    rows = []
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        token = admin_token(url)
        base = [schedule_http.baseline_rate(url, ctx.size(200, 3_000), 500 + r) for r in range(ctx.repeats)]
        gthread = f"gunicorn gthread -w {WORKERS} --threads {THREADS}"
        waitress = f"waitress, 1 process, {WORKERS * THREADS} threads (tickler serve)"
        configs: list[tuple[str, str, dict[str, str], int, str]] = [
            (f"{gthread}, group commit 2 ms", "gunicorn", {}, 1, "lean"),
            (f"{gthread}, group commit 2 ms", "gunicorn", {}, 4, "lean"),
            (f"{gthread}, group commit 2 ms", "gunicorn", {}, 16, "lean"),
            (f"{gthread}, group commit off", "gunicorn", {"TICKLER_GROUP_COMMIT_MS": "0"}, 1, "lean"),
            (f"{gthread}, group commit off", "gunicorn", {"TICKLER_GROUP_COMMIT_MS": "0"}, 4, "lean"),
            (f"{gthread}, group commit off", "gunicorn", {"TICKLER_GROUP_COMMIT_MS": "0"}, 16, "lean"),
            (f"{waitress}, group commit 2 ms", "waitress", {}, 4, "lean"),
            ("tickler serve (defaults: 2 web processes x 8 threads), group commit 2 ms", "serve", {}, 4, "lean"),
            (f"{gthread}, group commit 2 ms, without the lean route", "gunicorn", {}, 4, "flask"),
            (f"{waitress}, group commit 2 ms, without the lean route", "waitress", {}, 4, "flask"),
        ]
        if server_available("granian"):
            granian = f"granian --interface wsgi --workers {WORKERS} --blocking-threads {THREADS}"
            configs.append((f"{granian}, group commit 2 ms", "granian", {}, 4, "lean"))
        if ctx.quick:
            configs = configs[1:2]
        latency: dict[tuple[str, int], list[float]] = {}
        for n, (label, kind, env, clients, app) in enumerate(configs, start=1):
            row, latencies = _single_row(label, kind, env, clients, url, token, ctx, base, n, app)
            rows.append(row)
            latency[label, clients] = latencies
        on, off = f"{gthread}, group commit 2 ms", f"{gthread}, group commit off"
        gthread4 = next((r for r in rows if r.scenario == f"ingest: HTTP 1 event/request, {on}, 4 client(s)"), None)
        serve4 = next((r for r in rows if "tickler serve (defaults" in r.scenario), None)
        if gthread4 is not None:
            rows += _cpu_rows(gthread4)
            if serve4 is not None:
                rows.append(_serve_row(serve4, gthread4))
        rows += _latency_rows(
            {c: lat for (label, c), lat in latency.items() if label == on},
            {c: lat for (label, c), lat in latency.items() if label == off},
        )
    rows += _batch_rows(ctx)
    rows.append(_enqueue_row(ctx))
    return rows
