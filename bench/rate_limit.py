"""Rate limit: a queue with rate_per_second N drained by two worker processes; the rate achieved
(events claimed over the span of the claims) and the most events claimed in any one-second
window (from claimed_on), which must never exceed N."""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg

from bench.drain import fill_tickler, make_due_soon
from bench.harness import Context, Row, make_queue, say, wait_until_drained
from bench.procs import WorkerSpec, tickler_workers

RATES = (20, 200, 1000)
SECONDS = 5  # events enough for this many seconds at the rate


def _claims(url: str) -> list[datetime]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT claimed_on FROM tickler_event_all ORDER BY claimed_on")]


def busiest_second(claimed: list[datetime]) -> int:
    """The most claims in any window [t, t + 1 s) that starts at a claim."""
    most, end = 0, 0
    for start, at in enumerate(claimed):
        while end < len(claimed) and claimed[end] < at + timedelta(seconds=1):
            end += 1
        most = max(most, end - start)
    return most


def run(ctx: Context) -> list[Row]:
    rows = []
    for rate in RATES[:1] if ctx.quick else RATES:
        n = rate * SECONDS
        with ctx.database() as url:
            make_queue(url, rate_per_second=rate)
            specs = [WorkerSpec(url, "bench", 100, name=f"w{i}") for i in range(2)]
            with tickler_workers(specs):
                fill_tickler(url, n)
                make_due_soon(url, lead=0.3)
                wait_until_drained(url, timeout=120)
            claimed = _claims(url)
        # Each window takes `rate` events as soon as it opens: n events span (n / rate - 1) windows
        # from the first claim to the last, plus the last window itself.
        achieved = n / ((claimed[-1] - claimed[0]).total_seconds() + 1.0)
        most = busiest_second(claimed)
        say(f"rate {rate}/s: {n} events at {achieved:,.1f}/s; busiest second {most} events")
        rows.append(
            Row(
                f"rate limit {rate}/s, 2 worker processes, {n:,} due events: rate achieved",
                achieved,
                float(rate),
                "events/s",
                f"{rate}/s ± 5 %",
                abs(achieved - rate) <= 0.05 * rate,
                note=f"busiest one-second window: {most} events (never above {rate})",
            )
        )
        rows.append(
            Row(
                f"rate limit {rate}/s: most events claimed in any one-second window",
                float(most),
                float(rate),
                "events",
                f"≤ {rate}",
                most <= rate,
            )
        )
    return rows
