"""Dropping one queue's day of history by its own retention, while another queue's day stays
(issue #21's target: one day of 1M finished events dropped in < 1 s, claims unaffected; per
queue since migration 0074).

    .venv/bin/python -m bench.retention_drop [--events 1000000] [--database-url URL]

Two queues finish `--events` events each on the same day (tomorrow, whose table the maintenance
pass made with a part per retention class): `brief` keeps 1 day of history, `keeps` 30. Then the
pass runs with its clock two days on, while a probe process claims and reads counters on a third
queue every 50 ms: `brief`'s part of the day goes (events and timeline entries), `keeps`'s stays.
Reported: how long the pass took, the longest gap of the probe, its errors, and what is left.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from bench.cluster import PrivateCluster
from bench.harness import create_database, drop_database, make_queue, say, store_for
from bench.upgrade import Probe
from tickler.scheduler.migrate import migrate

_FINISHED = """
WITH moved AS (
    INSERT INTO tickler_event_history (queue, id, item_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on,
                                       dequeued_by, outcome, claimed_on, claimed_by, max_attempts, version)
    SELECT %(queue)s, %(offset)s + g, 'done:' || g, f.at - interval '1 minute', '{}', f.at - interval '2 minutes',
           'load', f.at, 'w', 'delivered', f.at, 'w', 10, 3
    FROM generate_series(CAST(%(start)s AS bigint), CAST(%(stop)s AS bigint)) AS g
    CROSS JOIN LATERAL (SELECT %(day)s + g * interval '50 milliseconds' AS at) AS f
    RETURNING queue, item_key, id, schedule_on, dequeued_on
)
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT queue, item_key, id, dequeued_on - interval '2 minutes', 'enqueued', 'load', schedule_on, '{}' FROM moved
"""


def measure(admin_url: str, events: int, chunk: int = 200_000) -> dict[str, Any]:
    url = create_database(admin_url)
    try:
        migrate(url)
        make_queue(url, "emails")  # the probe's
        make_queue(url, "brief", retention_days=1)
        make_queue(url, "keeps", retention_days=30)
        store = store_for(url, pool_size=1)
        try:
            store.history.maintain()  # the days ahead get their parts for these queues
        finally:
            store.engine.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day'").fetchone()
            assert row is not None
            day = row[0]  # tomorrow, UTC (a naive timestamp: the statement reads it as UTC)
            conn.execute("SET timezone = 'UTC'")
            conn.execute("ALTER TABLE tickler_timeline DISABLE TRIGGER tickler_count_minutes")
            started = time.perf_counter()
            for offset, queue in enumerate(("brief", "keeps")):
                for start in range(1, events + 1, chunk):
                    params = {"queue": queue, "offset": offset * events, "day": day}
                    conn.execute(_FINISHED, {**params, "start": start, "stop": min(events, start + chunk - 1)})
            conn.execute("ALTER TABLE tickler_timeline ENABLE TRIGGER tickler_count_minutes")
            conn.execute("VACUUM ANALYZE")
            say(f"filled 2 x {events:,} finished events in {time.perf_counter() - started:.0f} s")
            where = dict(
                conn.execute(
                    "SELECT queue, string_agg(DISTINCT tableoid::regclass::text, ', ') FROM tickler_event_history"
                    " GROUP BY 1"
                ).fetchall()
            )
            probe = Probe(url)
            probe.start()
            started = time.perf_counter()
            row = conn.execute(
                "SELECT dropped FROM tickler_maintain_history("
                "CAST(%s AS timestamp) AT TIME ZONE 'UTC' + interval '2 days 1 hour')",
                [day],
            ).fetchone()
            took = time.perf_counter() - started
            probe.stop()
            left = dict(conn.execute("SELECT queue, count(*) FROM tickler_event_history GROUP BY 1").fetchall())
            counted = dict(
                conn.execute(
                    "SELECT queue, sum(n) FROM tickler_queue_count WHERE state = 'delivered' GROUP BY 1"
                ).fetchall()
            )
        return {
            "events_per_queue": events,
            "parts_before": where,
            "dropped": row[0] if row else None,
            "drop_seconds": round(took, 3),
            "longest_probe_gap_seconds": round(probe.longest, 3),
            "probe_rounds": probe.rounds,
            "probe_errors": probe.errors,
            "events_left": {k: int(v) for k, v in left.items()},
            "delivered_counted": {k: int(v) for k, v in counted.items() if v},
        }
    finally:
        drop_database(admin_url, url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    cluster = None if args.database_url else PrivateCluster()
    admin_url = args.database_url or cluster.start()  # type: ignore[union-attr]
    try:
        result = measure(admin_url, args.events)
    finally:
        if cluster is not None:
            cluster.stop()
    for key, value in result.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
