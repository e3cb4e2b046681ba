"""A webhook burst: 200 events due at one instant, delivered by one worker with the defaults to the
receiver a new user writes first — a standard-library ThreadingHTTPServer (listen backlog 5,
HTTP/1.0, a new connection per request). Lateness of each arrival after the due time, and the
failed attempts the burst cost (timeline `failed` entries)."""

from __future__ import annotations

import psycopg

from bench.drain import fill_tickler, make_due_soon
from bench.harness import Context, Row, clock_offset, make_queue, median, percentile, say, wait_until_drained
from bench.procs import WorkerSpec, tickler_workers
from tests.receiver import modest_receiver

BURST = 200


def _failed_attempts(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM tickler_timeline WHERE action = 'failed'").fetchone()
    return int(row[0]) if row else 0


def run(ctx: Context) -> list[Row]:
    bursts = ctx.size(1, 5)
    late_p50, late_p99, late_max, failures = [], [], [], []
    with modest_receiver() as (arrived, hook_url), ctx.database() as url:
        make_queue(url, delivery_mode="webhook", webhook_url=hook_url)  # every other setting: default
        offset = clock_offset(url)
        with tickler_workers([WorkerSpec(url, "bench", 100, mode="webhook")]):
            for _ in range(bursts):
                arrived.clear()
                failed_before = _failed_attempts(url)
                fill_tickler(url, BURST)
                due = make_due_soon(url, lead=0.5) - offset  # wall-clock time of the due instant
                wait_until_drained(url, timeout=120)
                lateness = sorted(at - due for at in arrived.values())
                late_p50.append(percentile(lateness, 50))
                late_p99.append(percentile(lateness, 99))
                late_max.append(lateness[-1])
                failures.append(float(_failed_attempts(url) - failed_before))
                say(
                    f"burst of {BURST}: {len(lateness)} arrived, lateness p50 {late_p50[-1] * 1000:.0f} ms, "
                    f"p99 {late_p99[-1] * 1000:.0f} ms, last {late_max[-1] * 1000:.0f} ms; "
                    f"{failures[-1]:.0f} failed attempts"
                )
    name = f"webhook burst: {BURST} events due at once to a ThreadingHTTPServer (backlog 5, HTTP/1.0), defaults"
    return [
        Row(
            f"{name}: last arrival after the due time",
            median(late_max) * 1000,
            None,
            "ms",
            "< 1,000 ms",
            max(late_max) < 1.0,
            note=f"p50 {median(late_p50) * 1000:.0f} ms, p99 {median(late_p99) * 1000:.0f} ms "
            f"(medians of {bursts} bursts)",
            runs=[x * 1000 for x in late_max],
        ),
        Row(
            f"{name}: failed attempts per burst",
            max(failures),
            None,
            "attempts",
            "0",
            max(failures) == 0,
            runs=failures,
        ),
    ]
