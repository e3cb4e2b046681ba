"""Group claims: 1,000 groups x 20 due events, one lease per group, beside the advisory-lock baseline."""

from __future__ import annotations

from bench.harness import QUEUE, Context, Row, at_least
from bench.procs import WorkerSpec, baseline_drain_rate, tickler_rate, tickler_workers

TARGET = 0.6
WORKERS = 2
BATCH = 10  # groups per claim


def run(ctx: Context) -> list[Row]:
    groups, per_group = ctx.size(20, 1_000), ctx.size(5, 20)
    n = groups * per_group
    name = f"group claims, {groups} groups x {per_group} events, {WORKERS} workers, {BATCH} groups/claim"
    with ctx.shared_database() as url:
        specs = [WorkerSpec(url, QUEUE, BATCH, mode="group", name=f"w{i}") for i in range(WORKERS)]
        with tickler_workers(specs):
            tickler_runs = [tickler_rate(url, n, groups=groups) for _ in range(ctx.repeats)]
        base_runs, _ = ctx.repeat(baseline_drain_rate, url, n, workers=WORKERS, batch=BATCH, groups=groups)
    return [Row.measured(name, tickler_runs, base_runs, target="≥ 60% of baseline", met=at_least(TARGET))]
