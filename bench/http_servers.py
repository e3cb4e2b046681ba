"""The HTTP ingest path under each WSGI server, side by side in one run: gunicorn gthread (the
deployment the README shows), granian's WSGI mode, waitress (what `tickler serve` runs), each with
the json module and with orjson writing responses (TICKLER_JSON; api/jsonio.py). Schedule one
event per request with 4 clients, and batches of 1,000; CPU per scheduled event of the server's
processes and the database (clients not counted). A server or orjson that is not installed is
skipped (`pip install -e '.[bench]'`)."""

from __future__ import annotations

import importlib.util

from bench import baseline, schedule_batch, schedule_http
from bench.cpu import CpuMeter
from bench.harness import Context, Row, admin_token, make_queue, median, median_cpu, say
from bench.http import Client, api_server, server_available

WORKERS, THREADS, CLIENTS = 2, 4, 4
# (server, label): the worker layout is the same for gunicorn and granian (2 processes x 4 threads);
# waitress is one process with 8 threads, as `tickler serve` runs it.
CONFIGS = (
    ("gunicorn", f"gunicorn gthread -w {WORKERS} --threads {THREADS}"),
    ("granian", f"granian --interface wsgi --workers {WORKERS} --blocking-threads {THREADS}"),
    ("waitress", f"waitress, 1 process, {WORKERS * THREADS} threads (tickler serve)"),
)


def _layout(kind: str) -> tuple[int, int]:
    return (1, WORKERS * THREADS) if kind == "waitress" else (WORKERS, THREADS)


def run(ctx: Context) -> list[Row]:
    has_orjson = importlib.util.find_spec("orjson") is not None
    jsons = ["stdlib", "orjson"] if has_orjson else ["stdlib"]
    configs = [c for c in CONFIGS if server_available(c[0])]
    if ctx.quick:  # one server, one JSON path: proves the harness (tests/test_json_output.py the switch)
        configs = [c for c in configs if c[0] == "granian"] or configs[:1]
        jsons = jsons[-1:]
    missing = [kind for kind, _ in CONFIGS if not server_available(kind)]
    if missing or not has_orjson:
        say(f"http_servers: not installed, skipped: {', '.join(missing + ([] if has_orjson else ['orjson']))}")
    total = ctx.size(40, 3_000)
    batch, batches = 1_000, ctx.size(1, 20)
    rows = []
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        token = admin_token(url)
        one_base = [schedule_http.baseline_rate(url, total, 100 + r) for r in range(ctx.repeats)]
        batch_base = [schedule_batch.baseline_rate(url, batch, batches, 100 + r) for r in range(ctx.repeats)]
        for kind, label in configs:
            workers, threads = _layout(kind)
            for json in jsons:
                with api_server(url, kind, workers=workers, threads=threads, json=json) as (port, pid):
                    rounds = 1_000 + 10 * len(rows)
                    one, one_cpu = schedule_http.measured_runs(url, port, pid, token, total, ctx.repeats, rounds)
                    many, many_cpu = [], []
                    client = Client(port, token)
                    schedule_batch.http_rate(client, batch, 1, 3_000 + len(rows))  # warm-up
                    for r in range(ctx.repeats):
                        with CpuMeter(url, [pid]) as meter:
                            many.append(schedule_batch.http_rate(client, batch, batches, 4_000 + 10 * len(rows) + r))
                        many_cpu.append(meter.use.per_event_us(batch * batches))
                for name, runs, cpus, base in (
                    (f"1 event/request, {CLIENTS} clients", one, one_cpu, one_base),
                    (f"batch of {batch:,}, 1 client", many, many_cpu, batch_base),
                ):
                    row = Row(
                        f"HTTP servers: schedule {name}, {label}, JSON out: {json}",
                        median(runs),
                        median(base),
                        "events/s",
                        "-",
                        None,
                        runs=runs,
                        baseline_runs=base,
                        cpu={"tickler": median_cpu(cpus)},
                    )
                    say(f"{row.scenario}: {row.tickler:,.0f}/s (baseline {row.baseline:,.0f}/s)")
                    rows.append(row)
    return rows
