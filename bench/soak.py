"""Soak: schedule and deliver at 1,000 events/s for 30 minutes (--soak-minutes); compare the last
minute with the first (throughput, p99 lateness) and watch what a claim must step over."""

from __future__ import annotations

import psycopg

from bench.harness import QUEUE, Context, Row, make_queue, percentile, say
from bench.lateness import tickler_lateness

RATE = 1_000
# Room for a whole claim batch in flight (the defaults give 64 per queue; see the lateness rows for
# what they do at 2,000/s): a soak is about drift over time, not about that limit.
ROOM = {"concurrency": 100, "queue_concurrency": 100}

STEP_OVER = """
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, FORMAT JSON)
SELECT id FROM tickler_event
WHERE queue = %s AND dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NULL AND schedule_on <= now()
ORDER BY schedule_on, id LIMIT 100
"""


def sample(url: str, samples: list[dict[str, float]]) -> None:
    """What a claim steps over now: buffers its candidate scan touches, the claim index's size, dead rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        plan = conn.execute(STEP_OVER, (QUEUE,)).fetchone()
        stats = conn.execute(
            "SELECT pg_relation_size('tickler_event_claimable'), n_dead_tup, n_live_tup, "
            "(SELECT count(*) FROM tickler_event) FROM pg_stat_user_tables WHERE relname = 'tickler_event'"
        ).fetchone()
    assert plan is not None and stats is not None
    top = plan[0][0]["Plan"]
    samples.append(
        {
            "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "index_kib": stats[0] / 1024,
            "dead": stats[1],
            "rows": stats[3],
        }
    )


def run(ctx: Context) -> list[Row]:
    seconds = ctx.soak_minutes * 60
    bucket = 60.0 if seconds >= 180 else max(1.0, seconds / 3)
    samples: list[dict[str, float]] = []
    with ctx.database() as url:
        make_queue(url)
        sample(url, samples)
        seen, achieved = tickler_lateness(url, RATE, seconds, "s-", room=ROOM, during=lambda: sample(url, samples))
        sample(url, samples)
    start = min(due for due, _ in seen)
    buckets: dict[int, list[float]] = {}
    for due, lag in seen:
        buckets.setdefault(int((due - start) // bucket), []).append(lag * 1000)
    last_full = int(seconds // bucket) - 1
    first, last = buckets.get(0, []), buckets.get(last_full, [])
    rate_first, rate_last = len(first) / bucket, len(last) / bucket
    p99_first, p99_last = percentile(first, 99), percentile(last, 99)
    per_bucket = [
        f"{k}: {len(v) / bucket:,.0f}/s p50 {percentile(v, 50):.1f} ms p99 {percentile(v, 99):.1f} ms"
        for k, v in sorted(buckets.items())
    ]
    ctx.findings[f"soak: per {bucket:g} s, {ctx.soak_minutes:g} min at {RATE:,}/s"] = (
        "```\n" + "\n".join(per_bucket) + "\n```\n\nWhat a claim steps over (sampled each minute: buffers touched "
        "by the claim's candidate scan, size of tickler_event_claimable, dead and total rows):\n\n```\n"
        + "\n".join(f"{s}" for s in samples)
        + "\n```"
    )
    say(
        f"soak: first {rate_first:,.0f}/s p99 {p99_first:.1f} ms, last {rate_last:,.0f}/s p99 {p99_last:.1f} ms; "
        f"achieved {achieved:,.0f}/s; samples {samples}"
    )
    throughput_ok = abs(rate_last - rate_first) <= 0.1 * rate_first
    p99_ok = p99_last <= 1.1 * p99_first
    label = f"soak {ctx.soak_minutes:g} min at {RATE:,}/s, 1 worker, 100 in flight"
    return [
        Row(
            f"{label}: throughput, last {bucket:g} s (baseline column: first)",
            rate_last,
            rate_first,
            "events/s",
            "within 10% of the first",
            throughput_ok,
        ),
        Row(
            f"{label}: p99 lateness, last {bucket:g} s (baseline column: first)",
            p99_last,
            p99_first,
            "ms",
            "within 10% of the first",
            p99_ok,
        ),
    ]
