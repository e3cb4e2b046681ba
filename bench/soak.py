"""Soak: schedule and deliver at 1,000 events/s (--soak-rate) for 30 minutes (--soak-minutes);
compare the last minute with the first (throughput, p99 lateness) and watch what a claim must step
over and how large the table and its claim index grow."""

from __future__ import annotations

import time

import psycopg

from bench.harness import QUEUE, Context, Row, make_queue, median, percentile, say
from bench.lateness import tickler_lateness
from bench.stall_watch import StallWatch, stalls

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
            "SELECT pg_relation_size('tickler_event_claimable_priority'), n_dead_tup, n_live_tup, "
            "(SELECT count(*) FROM tickler_event), (SELECT count(*) FROM tickler_event WHERE dequeued_on IS NULL), "
            "pg_relation_size('tickler_event'), "
            # the hot part as issue #21 bounds it: the open events' table and the lease table, each
            # with its indexes (and TOAST); history and the timeline are outside it
            "pg_total_relation_size('tickler_event') "
            "+ coalesce(pg_total_relation_size(to_regclass('tickler_lease')), 0) "
            "FROM pg_stat_user_tables WHERE relname = 'tickler_event'"
        ).fetchone()
    assert plan is not None and stats is not None
    top = plan[0][0]["Plan"]
    samples.append(
        {
            "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "index_kib": stats[0] / 1024,
            "dead": stats[1],
            "rows": stats[3],
            "open": stats[4],
            "table_mib": round(stats[5] / 1024 / 1024, 1),
            "hot_kib": round(stats[6] / 1024, 1),
        }
    )


WARMUP = 5.0  # seconds of start-up left out, as in the lateness scenario
WINDOW_BUCKETS = 5  # the robust comparison: first 5 minutes against the last 5


def _pooled(buckets: dict[int, list[float]], keys: range) -> list[float]:
    return [lag for k in keys for lag in buckets.get(k, [])]


def run(ctx: Context) -> list[Row]:
    seconds = ctx.soak_minutes * 60
    warmup = min(WARMUP, seconds / 10)
    bucket = 60.0 if seconds >= 180 else max(1.0, (seconds - warmup) / 3)
    samples: list[dict[str, float]] = []
    with ctx.database() as url:
        make_queue(url)
        sample(url, samples)
        with StallWatch(url) as watch:
            seen, achieved = tickler_lateness(
                url,
                ctx.soak_rate,
                seconds,
                "s-",
                room=ROOM,
                during=lambda: sample(url, samples),
                on_workers=watch.pids.extend,
            )
        sample(url, samples)
    start = min(due for due, _ in seen) + warmup
    buckets: dict[int, list[float]] = {}
    for due, lag in seen:
        if due >= start:
            buckets.setdefault(int((due - start) // bucket), []).append(lag * 1000)
    count = int((seconds - warmup) // bucket)  # full buckets
    first, last = buckets.get(0, []), buckets.get(count - 1, [])
    rate_first, rate_last = len(first) / bucket, len(last) / bucket
    p99_first, p99_last = percentile(first, 99), percentile(last, 99)
    per_bucket = [
        f"{k}: {len(v) / bucket:,.0f}/s p50 {percentile(v, 50):.1f} ms p99 {percentile(v, 99):.1f} ms"
        for k, v in sorted(buckets.items())
        if k < count
    ]
    ctx.findings[f"soak: per {bucket:g} s, {ctx.soak_minutes:g} min at {ctx.soak_rate:,}/s"] = (
        f"After {warmup:g} s of start-up.\n\n```\n" + "\n".join(per_bucket) + "\n```\n\n"
        "What a claim steps over (sampled each minute: buffers touched by the claim's candidate scan, "
        "size of tickler_event_claimable_priority, dead, total and open rows, size of tickler_event):\n\n```\n"
        + "\n".join(f"{s}" for s in samples)
        + "\n```\n\n"
        + _stall_report(seen, watch)
    )
    say(
        f"soak: first {rate_first:,.0f}/s p99 {p99_first:.1f} ms, last {rate_last:,.0f}/s p99 {p99_last:.1f} ms; "
        f"achieved {achieved:,.0f}/s; samples {samples}"
    )
    label = f"soak {ctx.soak_minutes:g} min at {ctx.soak_rate:,}/s, 1 worker, 100 in flight"
    rows = [
        Row(
            f"{label}: throughput, last {bucket:g} s (baseline column: first)",
            rate_last,
            rate_first,
            "events/s",
            "within 10% of the first",
            abs(rate_last - rate_first) <= 0.1 * rate_first,
        ),
        Row(
            f"{label}: p99 lateness, last {bucket:g} s (baseline column: first)",
            p99_last,
            p99_first,
            "ms",
            "within 10% of the first",
            p99_last <= 1.1 * p99_first,
        ),
    ]
    if count >= 2 * WINDOW_BUCKETS:
        # One minute's p99 is its 600 slowest events: a few seconds of checkpoint or vacuum move it
        # by several times. Windows of five minutes say whether lateness slid.
        head = percentile(_pooled(buckets, range(WINDOW_BUCKETS)), 99)
        tail = percentile(_pooled(buckets, range(count - WINDOW_BUCKETS, count)), 99)
        rows.append(
            Row(
                f"{label}: p99 lateness, last {WINDOW_BUCKETS * bucket / 60:g} min (baseline column: first)",
                tail,
                head,
                "ms",
                "within 10% of the first",
                tail <= 1.1 * head,
            )
        )
    during = samples[1:-1]  # the first sample is of an empty table, the last one after the drain
    if len(during) >= 2 * WINDOW_BUCKETS:
        # The bloat check: what a claim steps over in the last minutes against the first ones (the
        # claim index at its working size), however many events have finished meanwhile. Medians:
        # between two vacuums dead entries pile up, and one sample may catch the top of that heap.
        rows.append(
            _no_slide(
                during,
                "buffers",
                f"{label}: buffers a claim's candidate scan touches, median of the last 5 samples (baseline "
                f"column: of the first 5; {during[-1]['rows']:,.0f} events by the end)",
                "no slide: ≤ 1.5x the first, however many events finished",
            )
        )
        # The hot part of the table: the claim index holds open events only, so its size follows
        # the backlog, not the history (the table itself keeps finished events until the archive).
        rows.append(
            _no_slide(
                during,
                "index_kib",
                f"{label}: size of the claim index (tickler_event_claimable_priority), median of the last 5 samples "
                f"(baseline column: of the first 5; the table {during[-1]['table_mib']:,.0f} MiB by the end)",
                "no slide: ≤ 1.5x the first",
            )
        )
        rows.append(
            _no_slide(
                during,
                "hot_kib",
                f"{label}: the hot tables with their indexes (tickler_event + tickler_lease), median of the last 5 "
                "samples (baseline column: of the first 5)",
                "≤ 1.2x the first (issue #21)",
                bound=1.2,
            )
        )
    return rows


def _stall_report(seen: list[tuple[float, float]], watch: StallWatch) -> str:
    """The runs of events more than a second late, each with what the database was doing around it
    (bench/stall_watch.py), and when checkpoints ended."""
    found = stalls(seen)
    ends = ", ".join(time.strftime("%H:%M:%S", time.gmtime(at)) for at in watch.checkpoints()) or "none"
    text = f"Checkpoints ended at (UTC): {ends}.\n\nRuns of events more than 1 s late: {len(found)}.\n"
    for first, last, count in found[:5]:
        span = f"{time.strftime('%H:%M:%S', time.gmtime(first))} to {time.strftime('%H:%M:%S', time.gmtime(last))}"
        worst = max(lag for due, lag in seen if first <= due <= last)
        text += f"\n{count:,} events due {span}, worst {worst:.1f} s late:\n\n```\n"
        text += "\n".join(watch.around(first, last + worst)) + "\n```\n"
    return text


def _no_slide(during: list[dict[str, float]], key: str, scenario: str, target: str, bound: float = 1.5) -> Row:
    """The median of a sampled figure over the last WINDOW_BUCKETS samples against the first ones;
    held while it stays within `bound` times."""
    start = median([s[key] for s in during[:WINDOW_BUCKETS]])
    end = median([s[key] for s in during[-WINDOW_BUCKETS:]])
    unit = "KiB" if key.endswith("_kib") else key
    return Row(scenario, end, start, unit, target, end <= bound * start)
