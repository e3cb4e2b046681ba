"""Scale: claim latency with 10,000,000 pending future events vs 10,000 (the due index must make the
size irrelevant). The big table is built with one INSERT ... SELECT generate_series, then ANALYZE."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import sqlalchemy as sa

from bench.drain import fill_tickler
from bench.harness import QUEUE, Context, Row, make_queue, median, say, secondary_indexes_dropped, store_for
from tickler.scheduler.sql import q

CLAIM_LIMIT = 10
DUE = 1_000  # due events added on top of the future ones
TARGET = 1.5

PLAIN_CLAIM = """
UPDATE tickler_event SET claimed_on = now(), claimed_by = 'plain', lease_id = gen_random_uuid(),
       lease_expires_on = now() + interval '30 seconds'
WHERE id IN (
    SELECT id FROM tickler_event
    WHERE queue = %s AND dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NULL AND schedule_on <= now()
    ORDER BY schedule_on, id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, lease_id
"""


def build(url: str, future: int) -> float:
    """`future` pending events a day ahead, through one INSERT ... SELECT; return seconds taken.

    The secondary indexes are dropped for the load and built again after (same definitions).
    """
    make_queue(url)
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        with secondary_indexes_dropped(conn):
            conn.execute(
                "INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, "
                "max_attempts) SELECT %s, 'future:' || g, now() + interval '1 day' + g * interval '1 millisecond', "
                "jsonb_build_object('n', g), now(), 'bench', 10 FROM generate_series(1, %s) AS g",
                (QUEUE, future),
            )
        conn.execute("VACUUM ANALYZE tickler_event")
    return time.monotonic() - started


def claim_latencies(url: str, samples: int, acks: list[float]) -> tuple[list[float], list[float]]:
    """Milliseconds per LeaseStore.claim(limit 10) and per plain-SQL claim; the tickler acks are timed into `acks`."""
    store = store_for(url, pool_size=2)
    queue = store.queues.get(QUEUE)
    tickler_ms, plain_ms = [], []
    try:
        with psycopg.connect(url, autocommit=True) as plain:
            for _ in range(samples):
                started = time.perf_counter()
                leases = store.leases.claim(queue, worker="scale", limit=CLAIM_LIMIT)
                tickler_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                store.leases.ack([lease.lease_id for lease in leases])
                acks.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                rows = plain.execute(PLAIN_CLAIM, (QUEUE, CLAIM_LIMIT)).fetchall()
                plain_ms.append((time.perf_counter() - started) * 1000)
                store.leases.ack([str(row[1]) for row in rows])
    finally:
        store.engine.dispose()
    return tickler_ms, plain_ms


def explain(url: str, name: str, params: dict[str, Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a named query, rolled back."""
    store = store_for(url, pool_size=1)
    try:
        with store.engine.connect() as conn:
            text = sa.text("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING ON) " + q(name).text)
            lines = [row[0] for row in conn.execute(text, params)]
            conn.rollback()
    finally:
        store.engine.dispose()
    return "\n".join(lines)


def measure_state(ctx: Context, url: str, future: int) -> tuple[float, float]:
    tickler_runs, plain_runs = [], []
    acks: list[float] = []
    for _ in range(ctx.repeats):
        fill_tickler(url, DUE, delay_seconds=-1)
        t, p = claim_latencies(url, ctx.size(10, 40), acks)
        tickler_runs.append(median(t))
        plain_runs.append(median(p))
    say(f"claim latency at {future:,} future events: tickler {tickler_runs} ms, plain {plain_runs} ms")
    ctx.findings[f"scale: ack of {CLAIM_LIMIT} leases at {future:,} future events"] = (
        f"median {median(acks):.2f} ms, max {max(acks):.2f} ms over {len(acks)} acks (LeaseStore.ack)"
    )
    return median(tickler_runs), median(plain_runs)


def run(ctx: Context) -> list[Row]:
    from bench import counts

    small, big = ctx.size(1_000, 10_000), ctx.size(20_000, 10_000_000)
    with ctx.database() as url:
        build(url, small)
        small_t, small_p = measure_state(ctx, url, small)
    with ctx.database() as url:
        seconds = build(url, big)
        say(f"built {big:,} future events in {seconds:.0f} s")
        big_t, big_p = measure_state(ctx, url, big)
        fill_tickler(url, DUE, delay_seconds=-1)
        params = {
            "queue": QUEUE,
            "worker": "explain",
            "limit": CLAIM_LIMIT,
            "lease_seconds": 30,
            "now": None,
            "flow": False,
        }
        ctx.findings[f"scale: EXPLAIN (ANALYZE, BUFFERS) claim_events, {big:,} future + {DUE:,} due events"] = (
            "```\n" + explain(url, "claim_events", params) + "\n```"
        )
        params = {
            "queue": QUEUE,
            "limit": CLAIM_LIMIT,
            "scan": CLAIM_LIMIT * 50,
            "now": None,
            "flow": False,
            "cap": None,
        }
        ctx.findings[f"scale: EXPLAIN (ANALYZE, BUFFERS) lock_due_groups, {big:,} future events"] = (
            "```\n" + explain(url, "lock_due_groups", params) + "\n```"
        )
        ctx.shared["counts_rows"] = counts.measure(ctx, url, big)
    ratio = big_t / small_t
    say(f"scale ratio {ratio:.2f} (tickler), {big_p / small_p:.2f} (plain)")
    return [
        Row(
            f"scale: claim latency (limit {CLAIM_LIMIT}) with {big:,} pending future events",
            big_t,
            big_p,
            "ms",
            "-",
            None,
            runs=[big_t],
            baseline_runs=[big_p],
        ),
        Row(
            f"scale: claim latency (limit {CLAIM_LIMIT}) with {small:,} pending future events",
            small_t,
            small_p,
            "ms",
            "-",
            None,
            runs=[small_t],
            baseline_runs=[small_p],
        ),
        Row(
            f"scale: latency ratio {big:,} / {small:,} (baseline column: plain-SQL claim's ratio)",
            ratio,
            big_p / small_p,
            "x",
            "ratio ≤ 1.5",
            ratio <= TARGET,
        ),
    ]
