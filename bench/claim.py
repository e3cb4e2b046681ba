"""Claim + deliver + finish with an in-process no-op handler, 1/2/4 workers, beside the baseline."""

from __future__ import annotations

from bench import baseline
from bench.drain import baseline_fill, tickler_drain
from bench.harness import QUEUE, Context, Row, make_queue, median_cpu
from bench.procs import WorkerSpec, baseline_drain, tickler_workers

TARGET = 0.6


def measure(ctx: Context, *, workers: int, batch: int, n: int, default_config: bool = False) -> Row:
    name = f"claim+deliver+finish, no-op handler, {workers} worker(s), batch {batch}"
    if default_config:
        name += " (default concurrency and queue_concurrency)"
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        # The dispatcher claims min(batch, free slots): give it room for a whole batch unless asked not to.
        room = {} if default_config else {"concurrency": max(96, batch), "queue_concurrency": max(64, batch)}
        specs = [WorkerSpec(url, QUEUE, batch, name=f"w{i}", **room) for i in range(workers)]  # type: ignore[arg-type]
        tickler_runs, tickler_cpu = [], []
        with tickler_workers(specs) as procs:
            for _ in range(ctx.repeats):
                rate, cpu = tickler_drain(url, n, [p.pid for p in procs if p.pid])
                tickler_runs.append(rate)
                tickler_cpu.append(cpu.per_event_us(n))
        base_runs, base_cpu = [], []
        for _ in range(ctx.repeats):
            baseline_fill(url, n)
            seconds, cpu = baseline_drain(url, QUEUE, workers=workers, batch=batch)
            base_runs.append(n / seconds)
            base_cpu.append(cpu.per_event_us(n))
    per_event = {"tickler": median_cpu(tickler_cpu), "baseline": median_cpu(base_cpu)}
    return Row.throughput(name, tickler_runs, base_runs, "≥ 60% of baseline", TARGET, cpu=per_event)


def run(ctx: Context) -> list[Row]:
    if ctx.quick:  # one configuration of each kind proves the harness
        return [measure(ctx, workers=1, batch=1, n=50), measure(ctx, workers=2, batch=100, n=1_000)]
    rows = []
    for batch, n in ((1, 2_000), (100, 30_000)):
        for workers in (1, 2, 4):
            rows.append(measure(ctx, workers=workers, batch=batch, n=n))
    rows.append(measure(ctx, workers=1, batch=100, n=30_000, default_config=True))
    return rows
