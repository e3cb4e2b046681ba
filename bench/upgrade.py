"""How long the upgrade to history by day (migration 0021) takes, and what a client sees meanwhile.

    .venv/bin/python -m bench.upgrade [--events 1000000] [--from N] [--database-url URL]

Builds a database with the previous schema (migrations 0001-0020) holding `--events` events, 90%
finished over the last 30 days (each with its enqueued and delivered timeline rows) and 10% open,
as the previous release left them; then applies 0021 while a probe process reads a queue's counts
and claims every 50 ms, and reports the upgrade's time, the longest a probe waited, and the sizes
of the tables before and after; then drops the partitions of the upgraded history (retention of
one day) under the same probe. With --from N the database is first upgraded through migration N
(unwatched), and the upgrade from N to the newest is the one measured: the cost of the latest
migrations alone on a full history. Without --database-url it starts a private cluster
(bench/cluster.py).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from bench.cluster import PrivateCluster
from bench.harness import create_database, drop_database, say
from bench.procs import SPAWN
from tickler.scheduler.migrate import migrate

PREVIOUS = 20

_QUEUE = """
INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,
                           backoff_max_seconds, backoff_multiplier)
VALUES ('emails', 'pull', 30, 10, 1, 60, 2)
"""

# Finished events spread over the last 30 days, then the open ones (due in the future).
_FINISHED = """
INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
                           outcome, claimed_on, claimed_by, max_attempts, version)
SELECT 'emails', 'done:' || g, t, '{"to": "someone@example.com"}', t - interval '1 minute', 'load',
       t + interval '1 second', 'w', 'delivered', t, 'w', 10, 3
FROM (SELECT g, now() - interval '1 hour' - (g %% 30) * interval '1 day' - (g %% 80000) * interval '1 second' AS t
      FROM generate_series(CAST(%(start)s AS bigint), CAST(%(stop)s AS bigint)) AS g) AS s
"""
_OPEN = """
INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
SELECT 'emails', 'open:' || g, now() + interval '1 day' + g * interval '1 millisecond', '{"to": "someone@example.com"}',
       now(), 'load', 10
FROM generate_series(CAST(%(start)s AS bigint), CAST(%(stop)s AS bigint)) AS g
"""
_TIMELINE = """
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT e.queue, e.item_key, e.id, a.at, a.action, a.actor, e.schedule_on, a.details
FROM tickler_event AS e
CROSS JOIN LATERAL (VALUES
    (1, e.enqueued_on, 'enqueued', e.enqueued_by, '{"max_attempts": 10}'::jsonb),
    (2, e.dequeued_on, 'delivered', 'w',
     '{"lease_id": "00000000-0000-0000-0000-000000000000", "attempt": 1, "claim": {"ago": 1, "lease_seconds": 30}}')
) AS a (step, at, action, actor, details)
WHERE e.id BETWEEN %(start)s AND %(stop)s AND (a.step = 1 OR e.dequeued_on IS NOT NULL)
ORDER BY e.id, a.step
"""
_SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class AS c
WHERE c.relkind = 'r' AND (c.relname IN ('tickler_event', 'tickler_timeline')
   OR c.relname LIKE 'tickler_event_history%%' OR c.relname LIKE 'tickler_timeline_%%')
ORDER BY 1
"""


def fill(url: str, events: int, chunk: int = 200_000) -> None:
    finished = events * 9 // 10
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_QUEUE)
        # the dashboard's rollup has nothing to learn from a load of history
        conn.execute("ALTER TABLE tickler_timeline DISABLE TRIGGER tickler_count_minutes")
        for start in range(1, finished + 1, chunk):
            conn.execute(_FINISHED, {"start": start, "stop": min(finished, start + chunk - 1)})
        for start in range(1, events - finished + 1, chunk):
            conn.execute(_OPEN, {"start": start, "stop": min(events - finished, start + chunk - 1)})
        for start in range(1, events + 1, chunk):
            conn.execute(_TIMELINE, {"start": start, "stop": start + chunk - 1})
        conn.execute("ALTER TABLE tickler_timeline ENABLE TRIGGER tickler_count_minutes")
        conn.execute("VACUUM ANALYZE")


def sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {name: int(size) for name, size in conn.execute(_SIZES)}


def _probe(url: str, ready: Any, stop: Any, out: Any) -> None:
    """What a client meets during the upgrade: a queue's counts and an (empty) claim every 50 ms,
    in a process of its own. Reports the longest gap between two finished rounds (a wait for a
    lock shows there, whatever statement waited), the rounds, and any error."""
    longest, rounds, errors = 0.0, 0, []
    last = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            try:
                conn.execute("SELECT state, sum(n) FROM tickler_queue_count WHERE queue = 'emails' GROUP BY 1")
                conn.execute(
                    "SELECT id FROM tickler_event WHERE queue = 'emails' AND dequeued_on IS NULL"
                    " AND lease_id IS NULL AND group_key IS NULL AND schedule_on <= now()"
                    " ORDER BY schedule_on, id LIMIT 10 FOR UPDATE SKIP LOCKED"
                )
            except psycopg.Error as error:
                errors.append(str(error).splitlines()[0])
            now = time.perf_counter()
            longest, rounds, last = max(longest, now - last), rounds + 1, now
            ready.set()
            time.sleep(0.05)
    out.put((longest, rounds, errors))


class Probe:
    def __init__(self, url: str) -> None:
        self._ready, self._stop, self._out = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
        self._process = SPAWN.Process(target=_probe, args=(url, self._ready, self._stop, self._out), daemon=True)
        self.longest, self.rounds, self.errors = 0.0, 0, []

    def start(self) -> None:
        self._process.start()
        if not self._ready.wait(timeout=300):  # probing before what it watches starts
            raise RuntimeError("the probe did not start")

    def stop(self) -> None:
        self._stop.set()
        self.longest, self.rounds, self.errors = self._out.get(timeout=3600)
        self._process.join()


def measure(admin_url: str, events: int, start: int = PREVIOUS) -> dict[str, Any]:
    url = create_database(admin_url)
    try:
        migrate(url, through=PREVIOUS)
        started = time.perf_counter()
        fill(url, events)
        say(f"filled {events:,} events in {time.perf_counter() - started:.0f} s")
        if start > PREVIOUS:
            started = time.perf_counter()
            migrate(url, through=start)
            say(f"upgraded through {start} (not measured) in {time.perf_counter() - started:.0f} s")
        before = sizes(url)
        upgrade_probe = Probe(url)
        upgrade_probe.start()
        started = time.perf_counter()
        migrate(url)
        took = time.perf_counter() - started
        upgrade_probe.stop()
        after = sizes(url)
        # Retention: the upgraded partitions (every finished event and timeline entry from before
        # the upgrade) dropped as one day would be, while the probe claims.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE tickler_queue SET retention_days = 1")
            drop_probe = Probe(url)
            drop_probe.start()
            started = time.perf_counter()
            # two days on: the upgraded partitions end at the start of the upgrade's day
            dropped = conn.execute("SELECT dropped FROM tickler_maintain_history(now() + interval '2 days')").fetchone()
            drop_took = time.perf_counter() - started
            drop_probe.stop()
            counts = dict(conn.execute("SELECT state, sum(n) FROM tickler_queue_count GROUP BY 1").fetchall())
        return {
            "events": events,
            "upgrade_from": start,
            "upgrade_seconds": round(took, 1),
            "longest_probe_seconds": round(upgrade_probe.longest, 1),
            "probe_errors": upgrade_probe.errors,
            "before_mib": {k: round(v / 2**20) for k, v in before.items()},
            "after_mib": {k: round(v / 2**20) for k, v in after.items() if v > 2**20},
            "dropped": dropped[0] if dropped else None,
            "drop_seconds": round(drop_took, 2),
            "longest_probe_during_drop_seconds": round(drop_probe.longest, 2),
            "probe_errors_during_drop": drop_probe.errors,
            "counts_after_drop": {k: int(v) for k, v in counts.items()},
        }
    finally:
        drop_database(admin_url, url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--from", dest="start", type=int, default=PREVIOUS, help="measure the upgrade from N")
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    cluster = None if args.database_url else PrivateCluster()
    admin_url = args.database_url or cluster.start()  # type: ignore[union-attr]
    try:
        result = measure(admin_url, args.events, args.start)
    finally:
        if cluster is not None:
            cluster.stop()
    for key, value in result.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
