"""The dashboard at 10,000,000 events: how long each page takes, and what the per-minute rollup
costs the statements that finish events.

    .venv/bin/python -m bench.dashboard [--events 10000000] [--url postgresql://...]

Builds one queue holding `events` events (90 % delivered over the last 30 days, 1 % dead, 8.9 %
pending in the future, 0.1 % due now, 200 in flight), an hour of delivery history in the
timeline (so the rollup is full), and one key with a long timeline; ANALYZE; then times each page
through the Flask app (real database, signed-in session), median of `--repeats` requests. The
figures are written to docs/dashboard.md by hand (they are not asserted anywhere).
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import psycopg

from bench.harness import (
    DEFAULT_URL,
    create_database,
    drop_database,
    make_queue,
    median,
    resolve_server,
    say,
    secondary_indexes_dropped,
)
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.migrate import migrate

QUEUE = "bench"

LOAD = """
INSERT INTO tickler_event (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by,
                           dequeued_on, dequeued_by, outcome, claimed_on, claimed_by, lease_id,
                           lease_expires_on, redeliver_count, max_attempts, last_error)
SELECT %(queue)s, 'key:' || g, 'group:' || (g %% 1000),
       CASE WHEN kind = 'future' THEN now() + g * interval '10 milliseconds'
            WHEN kind = 'due' THEN now() - interval '10 minutes' + (g %% 600) * interval '1 second'
            ELSE now() - interval '30 days' + g * interval '250 milliseconds' END,
       jsonb_build_object('n', g), now() - interval '31 days', 'bench',
       CASE WHEN kind IN ('delivered', 'dead') THEN now() - interval '30 days' + g * interval '250 milliseconds' END,
       CASE WHEN kind IN ('delivered', 'dead') THEN 'worker' END,
       CASE WHEN kind IN ('delivered', 'dead') THEN kind END,
       CASE WHEN kind = 'flight' THEN now() END, CASE WHEN kind = 'flight' THEN 'worker-1' END,
       CASE WHEN kind = 'flight' THEN gen_random_uuid() END,
       CASE WHEN kind = 'flight' THEN now() + interval '1 hour' END,
       CASE WHEN kind = 'dead' THEN 9 ELSE 0 END, 10,
       CASE WHEN kind = 'dead' THEN 'HTTP 500' END
FROM (
    SELECT g, CASE WHEN g %% 1000 < 900 THEN 'delivered' WHEN g %% 1000 < 910 THEN 'dead'
                   WHEN g %% 1000 < 999 THEN 'future' WHEN g %% 50000 = 999 THEN 'flight' ELSE 'due' END AS kind
    FROM generate_series(1, CAST(%(events)s AS bigint)) AS g
) AS s
"""

# An hour of deliveries (100 a second) and failures, as the finish statements write them: in
# statements of 100 rows, so that the rollup trigger runs as often as it would.
HISTORY = """
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT %(queue)s, 'key:' || g, g, now() - interval '1 hour' + g * interval '10 milliseconds',
       CASE WHEN g %% 20 = 0 THEN 'failed' ELSE 'delivered' END, 'worker', now(), '{}'
FROM generate_series(CAST(%(first)s AS bigint), CAST(%(last)s AS bigint)) AS g
"""

STORY = """
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT %(queue)s, 'key:1', 1, now() - interval '31 days' + g * interval '1 minute',
       (ARRAY['enqueued', 'claimed', 'failed'])[1 + g %% 3], 'worker', now(),
       jsonb_build_object('attempt', g / 3, 'error', 'HTTP 500')
FROM generate_series(1, 60) AS g
"""

# A key debounced 3,000 times (its timeline is paged: the page shows the newest 100 entries).
DEBOUNCED = """
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT %(queue)s, 'key:2', 2, now() - interval '3 days' + g * interval '1 minute',
       CASE WHEN g = 1 THEN 'enqueued' ELSE 'debounced' END, 'bench', now(),
       jsonb_build_object('previous_schedule_on', now())
FROM generate_series(1, 3000) AS g
"""

ROLLUP_STATEMENT = """
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT %(queue)s, 'trig:' || g, g, now(), 'delivered', 'worker', now(), '{}' FROM generate_series(1, 100) AS g
"""


def build(url: str, events: int) -> None:
    make_queue(url, QUEUE)
    with psycopg.connect(url, autocommit=True) as conn:
        with secondary_indexes_dropped(conn):
            started = time.monotonic()
            conn.execute(LOAD, {"queue": QUEUE, "events": events})
            say(f"{events:,} events in {time.monotonic() - started:.0f} s")
        for first in range(0, 360_000, 100):
            conn.execute(HISTORY, {"queue": QUEUE, "first": first + 1, "last": first + 100})
        conn.execute(STORY, {"queue": QUEUE})
        conn.execute(DEBOUNCED, {"queue": QUEUE})
        conn.execute("VACUUM ANALYZE tickler_event")
        conn.execute("VACUUM ANALYZE tickler_timeline")
        conn.execute("ANALYZE tickler_minute_stat")


def time_pages(url: str, repeats: int) -> dict[str, float]:
    app = create_app(Settings(database_url=url, migrate_on_start=False, cache_seconds=5), configure_logs=False)
    store = app.extensions["tickler"].store
    token = store.tokens.create("bench-admin", is_admin=True)
    client = app.test_client()
    page = client.get("/ui/sign-in").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf is not None
    assert client.post("/ui/sign-in", data={"token": token, "csrf_token": csrf[1]}).status_code == 303
    pages = {
        "queues overview": "/ui/",
        "queue, first page": f"/ui/queues/{QUEUE}",
        "queue, dead events": f"/ui/queues/{QUEUE}?status=dead",
        "queue, key prefix": f"/ui/queues/{QUEUE}?item_key_prefix=key:12345",
        "queue, group + time": f"/ui/queues/{QUEUE}?group_key=group:7&since=2020-01-01T00:00",
        "one key (60 entries)": f"/ui/queues/{QUEUE}/events/key:1",
        "one key (3,000 entries, newest 100)": f"/ui/queues/{QUEUE}/events/key:2",
        "leases in flight": "/ui/leases",
        "schedules": f"/ui/queues/{QUEUE}/schedules",
        "settings": f"/ui/queues/{QUEUE}/settings",
        "tokens": "/ui/tokens",
        "bulk cancel, confirmation (counts)": f"/ui/queues/{QUEUE}/events/cancel?group_key=group:7",
    }
    results: dict[str, float] = {}
    for name, path in pages.items():
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
            response.close()
        results[name] = median(times[1:])  # the first request warms the pool and the plan cache
        say(f"{name}: {results[name]:.1f} ms")
    close_app(app)
    return results


def rollup_cost(url: str, statements: int) -> tuple[float, float]:
    """Milliseconds per 100-row timeline insert with the rollup trigger, and without it."""

    def run(conn: psycopg.Connection[Any]) -> float:
        started = time.perf_counter()
        for _ in range(statements):
            conn.execute(ROLLUP_STATEMENT, {"queue": QUEUE})
        return (time.perf_counter() - started) * 1000 / statements

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")  # the statement's own cost, not the WAL flush
        with_trigger = [run(conn) for _ in range(3)]
        conn.execute("ALTER TABLE tickler_timeline DISABLE TRIGGER tickler_count_minutes")
        without = [run(conn) for _ in range(3)]
        conn.execute("ALTER TABLE tickler_timeline ENABLE TRIGGER tickler_count_minutes")
    return median(with_trigger), median(without)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--url", default=None, help=f"PostgreSQL server (default {DEFAULT_URL} or embedded)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", metavar="URL", help="time the pages of a database built before with --keep")
    args = parser.parse_args()
    admin_url = resolve_server(args.url)
    url = args.reuse or create_database(admin_url)
    say(f"database {url}")
    try:
        if not args.reuse:
            migrate(url)
            build(url, args.events)
        pages = time_pages(url, args.repeats)
        with_trigger, without = rollup_cost(url, 300)
        print(f"\n| page at {args.events:,} events | median ms |\n|---|---|")
        for name, ms in pages.items():
            print(f"| {name} | {ms:.1f} |")
        print(
            f"\nrollup trigger: {with_trigger:.3f} ms per 100-row timeline insert with it, "
            f"{without:.3f} ms without (+{with_trigger - without:.3f} ms)"
        )
    finally:
        if not args.keep and not args.reuse:
            drop_database(admin_url, url)


if __name__ == "__main__":
    main()
