"""A claim with a large history against one with none (issue #21's target: ≤ 1.2x).

    .venv/bin/python -m bench.history_claims [--history 10000000] [--database-url URL]

Two databases with the same 10,000 due events; one also holds `--history` finished events (and
their timeline rows) in its history. Both are built first; then each in turn claims 10 events and
gives them back (release), 500 rounds (interleaved, so that the machine's load falls on both).
Reported: the median claim time and the shared buffers one claim touches (EXPLAIN ANALYZE,
BUFFERS), a count that does not depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg

from bench.cluster import PrivateCluster
from bench.harness import QUEUE, create_database, drop_database, make_queue, say, store_for
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent
from tickler.scheduler.sql import queries

_HISTORY = """
WITH moved AS (
    INSERT INTO tickler_event_history (queue, id, item_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on,
                                       dequeued_by, outcome, claimed_on, claimed_by, max_attempts, version)
    SELECT %(queue)s, -g, 'done:' || g, now() - interval '1 hour', '{}', now() - interval '2 hours', 'load',
           now() - interval '1 hour', 'w', 'delivered', now() - interval '1 hour', 'w', 10, 3
    FROM generate_series(CAST(%(start)s AS bigint), CAST(%(stop)s AS bigint)) AS g
    RETURNING queue, item_key, id, dequeued_on
)
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, details)
SELECT queue, item_key, id, dequeued_on, 'delivered', 'w', '{}' FROM moved
"""


def _buffers(plan: Any) -> int:
    node = plan[0]["Plan"]
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


class Side:
    """One database: 10,000 due events and `history` finished ones; what one claim of it touches."""

    def __init__(self, admin_url: str, history: int) -> None:
        self.history = history
        self.url = create_database(admin_url)
        migrate(self.url)
        make_queue(self.url, QUEUE)
        self.store = store_for(self.url)
        self.queue = self.store.queues.get(QUEUE)
        self.store.events.schedule_batch(
            self.queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(10_000)], actor="b"
        )
        with psycopg.connect(self.url, autocommit=True) as conn:
            for start in range(1, history + 1, 500_000):
                conn.execute(_HISTORY, {"queue": QUEUE, "start": start, "stop": min(history, start + 499_999)})
            conn.execute("VACUUM ANALYZE")
            claim = str(queries()["claim_events"].compile(compile_kwargs={"render_postcompile": True}))
            for key in ("queue", "worker", "limit", "lease_seconds", "now", "flow"):
                claim = claim.replace(f":{key}", f"%({key})s")
            params = {"queue": QUEUE, "worker": "b", "limit": 10, "lease_seconds": 30, "now": None, "flow": False}
            conn.execute("BEGIN")
            row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim}", params).fetchone()
            conn.execute("ROLLBACK")
        assert row is not None
        self.buffers = _buffers(row[0] if isinstance(row[0], list) else json.loads(row[0]))
        self.times: list[float] = []

    def claim_once(self) -> None:
        started = time.perf_counter()
        leases = self.store.leases.claim(self.queue, worker="b", limit=10)
        self.times.append((time.perf_counter() - started) * 1000)
        self.store.leases.release([lease.lease_id for lease in leases], actor="b")

    def result(self) -> dict[str, Any]:
        return {
            "history": self.history,
            "claim_ms_median": round(statistics.median(self.times), 3),
            "claim_buffers": self.buffers,
        }


def measure(admin_url: str, history: int, rounds: int = 500) -> list[dict[str, Any]]:
    """Both databases built first, then their claims interleaved (one of each per round): on a shared
    machine a change of load between two sequential runs would move one side's times alone."""
    sides = [Side(admin_url, 0), Side(admin_url, history)]
    try:
        for _ in range(rounds):
            for side in sides:
                side.claim_once()
        return [side.result() for side in sides]
    finally:
        for side in sides:
            side.store.engine.dispose()
            drop_database(admin_url, side.url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    cluster = None if args.database_url else PrivateCluster()
    admin_url = args.database_url or cluster.start()  # type: ignore[union-attr]
    try:
        none, full = measure(admin_url, args.history)
        say(json.dumps(none))
        say(json.dumps(full))
        say(f"ratio of the medians: {full['claim_ms_median'] / none['claim_ms_median']:.2f}")
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
