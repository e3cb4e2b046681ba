"""A claim with a large history against one with none (issue #21's target: ≤ 1.2x).

    .venv/bin/python -m bench.history_claims [--history 10000000] [--database-url URL]

Two databases with the same 10,000 due events; one also holds `--history` finished events (and
their timeline rows) in its history. Each claims 10 events at a time and gives them back (release)
500 times; reported: the median claim time and the shared buffers one claim touches (EXPLAIN
ANALYZE, BUFFERS), a count that does not depend on how busy the machine is.
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


def measure(admin_url: str, history: int) -> dict[str, Any]:
    url = create_database(admin_url)
    try:
        migrate(url)
        make_queue(url, QUEUE)
        store = store_for(url)
        queue = store.queues.get(QUEUE)
        store.events.schedule_batch(queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(10_000)], actor="b")
        with psycopg.connect(url, autocommit=True) as conn:
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
        buffers = _buffers(row[0] if isinstance(row[0], list) else json.loads(row[0]))
        times = []
        for _ in range(500):
            started = time.perf_counter()
            leases = store.leases.claim(queue, worker="b", limit=10)
            times.append((time.perf_counter() - started) * 1000)
            store.leases.release([lease.lease_id for lease in leases], actor="b")
        store.engine.dispose()
        return {"history": history, "claim_ms_median": round(statistics.median(times), 3), "claim_buffers": buffers}
    finally:
        drop_database(admin_url, url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    cluster = None if args.database_url else PrivateCluster()
    admin_url = args.database_url or cluster.start()  # type: ignore[union-attr]
    try:
        for history in (0, args.history):
            result = measure(admin_url, history)
            say(json.dumps(result))
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
