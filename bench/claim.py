"""Claim + deliver + finish with an in-process no-op handler, 1/2/4 workers, beside the baseline."""

from __future__ import annotations

from bench.harness import Context, Row, at_least, median_cpu
from bench.procs import baseline_drain_rate, batch_workers, tickler_drain, tickler_workers

TARGET = 0.6


def measure(ctx: Context, *, workers: int, batch: int, n: int, default_config: bool = False) -> Row:
    name = f"claim+deliver+finish, no-op handler, {workers} worker(s), batch {batch}"
    if default_config:
        name += " (default concurrency and queue_concurrency)"
    with ctx.shared_database() as url:
        with tickler_workers(batch_workers(url, workers, batch, room=not default_config)) as procs:
            tickler_runs, tickler_cpu = ctx.repeat(tickler_drain, url, n, [p.pid for p in procs if p.pid])
        base_runs, base_cpu = ctx.repeat(baseline_drain_rate, url, n, workers=workers, batch=batch)
    per_event = {"tickler": median_cpu(tickler_cpu), "baseline": median_cpu(base_cpu)}
    return Row.measured(name, tickler_runs, base_runs, target="≥ 60% of baseline", met=at_least(TARGET), cpu=per_event)


def run(ctx: Context) -> list[Row]:
    if ctx.quick:  # one configuration of each kind proves the harness
        return [measure(ctx, workers=1, batch=1, n=50), measure(ctx, workers=2, batch=100, n=1_000)]
    rows = []
    for batch, n in ((1, 2_000), (100, 30_000)):
        for workers in (1, 2, 4):
            rows.append(measure(ctx, workers=workers, batch=batch, n=n))
    rows.append(measure(ctx, workers=1, batch=100, n=30_000, default_config=True))
    return rows
