"""Group claims: 1,000 groups x 20 due events, one lease per group, beside the advisory-lock baseline."""

from __future__ import annotations

from bench import baseline
from bench.drain import baseline_fill, tickler_rate
from bench.harness import QUEUE, Context, Row, make_queue
from bench.procs import WorkerSpec, baseline_drain, tickler_workers

TARGET = 0.6
WORKERS = 2
BATCH = 10  # groups per claim


def run(ctx: Context) -> list[Row]:
    groups, per_group = ctx.size(20, 1_000), ctx.size(5, 20)
    n = groups * per_group
    name = f"group claims, {groups} groups x {per_group} events, {WORKERS} workers, {BATCH} groups/claim"
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        specs = [WorkerSpec(url, QUEUE, BATCH, mode="group", name=f"w{i}") for i in range(WORKERS)]
        with tickler_workers(specs):
            tickler_runs = [tickler_rate(url, n, groups=groups) for _ in range(ctx.repeats)]
        base_runs = []
        for _ in range(ctx.repeats):
            baseline_fill(url, n, groups=groups)
            base_runs.append(n / baseline_drain(url, QUEUE, workers=WORKERS, batch=BATCH, group=True)[0])
    return [Row.throughput(name, tickler_runs, base_runs, "≥ 60% of baseline", TARGET, cpu={})]
