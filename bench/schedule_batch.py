"""Schedule via HTTP in batches: new keys (1,000 and 10,000 a batch, and 1,000 in groups) and the keys
of open events sent again with each `on_conflict`, beside COPY -> INSERT ... ON CONFLICT."""

from __future__ import annotations

import time

from bench import baseline
from bench.cpu import CpuMeter
from bench.harness import QUEUE, Context, Row, admin_token, at_least, median_cpu
from bench.http import Client, gunicorn

TARGET = 0.5
MODES = ("reject", "ignore", "replace", "debounce")
OUTCOME = {None: "created", "reject": "rejected", "ignore": "ignored", "replace": "replaced", "debounce": "debounced"}
# (what the batches hold, batch size, batches per run, groups, on_conflict over open keys)
CASES = (
    ("", 1_000, 30, 0, None),
    ("", 10_000, 5, 0, None),
    ("in 100 groups", 1_000, 30, 100, None),
    ("in 1,000 groups", 1_000, 30, 1_000, None),  # a group per event of a batch: no group repeats in it
    *((f"over open keys, on_conflict {mode}", 1_000, 30, 0, mode) for mode in MODES),
)


def _keys(prefix: str, batch: int, batches: int, groups: int) -> list[list[tuple[str, str | None]]]:
    return [[(f"{prefix}-{j}-{i}", f"g{i % groups}" if groups else None) for i in range(batch)] for j in range(batches)]


def http_rate(client: Client, keys: list[list[tuple[str, str | None]]], on_conflict: str | None = None) -> float:
    bodies = [
        {
            "events": [
                {"item_key": k, "delay_seconds": 3600, "data": {"n": i}, **({"group_key": g} if g else {})}
                for i, (k, g) in enumerate(chunk)
            ],
            **({"on_conflict": on_conflict} if on_conflict else {}),
        }
        for chunk in keys
    ]
    started = time.perf_counter()
    for body in bodies:
        status, answer = client.post(f"/v1/queues/{QUEUE}/events/batch", body)
        if status != 200 or any(r["outcome"] != OUTCOME[on_conflict] for r in answer["results"]):
            raise RuntimeError(f"batch failed: {status} {str(answer)[:200]}")
    return sum(map(len, keys)) / (time.perf_counter() - started)


def baseline_rate(url: str, keys: list[list[tuple[str, str | None]]], on_conflict: str | None = None) -> float:
    with baseline.connect(url, autocommit=False) as conn:
        if on_conflict:  # the keys' open jobs, not timed
            for chunk in keys:
                baseline.insert_copy(conn, QUEUE, [k for k, _ in chunk], delay=3600)
        started = time.perf_counter()
        for chunk in keys:
            keys_, groups = [k for k, _ in chunk], [g for _, g in chunk]
            baseline.insert_copy(
                conn, QUEUE, keys_, delay=3600, groups=groups, update=on_conflict in ("replace", "debounce")
            )
        return sum(map(len, keys)) / (time.perf_counter() - started)


def run(ctx: Context) -> list[Row]:
    rows = []
    for what, batch, batches, groups, on_conflict in CASES:
        batch, batches = ctx.size(100, batch), ctx.size(2, batches)
        with ctx.shared_database() as url:
            token = admin_token(url)
            base_runs = [
                baseline_rate(url, _keys(f"b{r}", batch, batches, groups), on_conflict) for r in range(ctx.repeats)
            ]
            runs, cpus = [], []
            with gunicorn(url) as (port, pid):
                client = Client(port, token)
                http_rate(client, _keys("warm", batch, 1, groups))  # pools, caches
                for r in range(ctx.repeats):
                    keys = _keys(f"r{r}", batch, batches, groups)
                    if on_conflict:
                        http_rate(client, keys)  # the keys' open events, not timed
                    with CpuMeter(url, [pid]) as meter:  # the server and the database; not the client
                        runs.append(http_rate(client, keys, on_conflict))
                    cpus.append(meter.use.per_event_us(batch * batches))
        name = f"schedule via HTTP batch of {batch:,}{f' {what}' if what else ''}, 1 client"
        met, cpu = at_least(TARGET), {"tickler": median_cpu(cpus)}
        rows.append(Row.measured(name, runs, base_runs, target="≥ 50% of COPY→INSERT ON CONFLICT", met=met, cpu=cpu))
    return rows
