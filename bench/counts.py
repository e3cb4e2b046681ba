"""The queue counts endpoint (GET /v1/queues/{q}) at 10,000,000 events, beside a plain count(*)."""

from __future__ import annotations

import time

import psycopg

from bench.harness import QUEUE, Context, Row, admin_token, median, say

TARGET_MS = 50.0


def measure(ctx: Context, url: str, events: int) -> list[Row]:
    """Time the endpoint in-process (Flask test client: the whole view, no network) on a built state."""
    from tickler.api import close_app, create_app
    from tickler.config import Settings

    app = create_app(Settings(database_url=url, migrate_on_start=False, log_level="WARNING"), configure_logs=False)
    client = app.test_client()
    headers = {"Authorization": f"Bearer {admin_token(url)}"}
    client.get(f"/v1/queues/{QUEUE}", headers=headers)  # warm: pool, caches
    runs = []
    for _ in range(ctx.repeats):
        times = []
        for _ in range(ctx.size(5, 20)):
            started = time.perf_counter()
            response = client.get(f"/v1/queues/{QUEUE}", headers=headers)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.status_code
        runs.append(median(times))
    counts = response.get_json()["counts"]
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        conn.execute("SELECT count(*) FROM tickler_event WHERE queue = %s AND dequeued_on IS NULL", (QUEUE,))
        plain = (time.perf_counter() - started) * 1000
    close_app(app)
    t = median(runs)
    say(f"counts at {events:,}: {t:.2f} ms ({runs}); plain count(*) {plain:.0f} ms; {counts}")
    ctx.findings[f"counts: answer at {events:,} events"] = f"`{counts}`"
    return [
        Row(
            f"queue counts endpoint at {events:,} events (baseline: plain count(*) of open events)",
            t,
            plain,
            "ms",
            "≤ 50 ms",
            t <= TARGET_MS,
            runs=runs,
            baseline_runs=[plain],
        )
    ]


def run(ctx: Context) -> list[Row]:
    if "counts_rows" in ctx.shared:  # measured on the state the scale scenario built
        rows: list[Row] = ctx.shared.pop("counts_rows")
        return rows
    from bench.scale import build

    events = ctx.size(20_000, 10_000_000)
    with ctx.database() as url:
        build(url, events)
        return measure(ctx, url, events)
