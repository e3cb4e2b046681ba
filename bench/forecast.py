"""Upcoming load: how long a queue's forecast takes with many pending events, and what keeping its
per-minute counters costs a 1,000-event batch.

    python -m bench.forecast [--events 10000000] [--database-url URL]

A fresh database on the server (the local PostgreSQL by default), N pending events of one queue
spread over the next 30 days (written in large INSERT statements through the event triggers, as
an import would), the counters folded as the dispatcher's upkeep does, then the median of the
forecast's latency (24 hours by hour, 168 hours by minute), measured the way the API calls it.
Then 1,000-event batches through the store, with the triggers as they are and with their
tickler_due_count statements taken out (the write path before the forecast), alternating."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench.harness import DEFAULT_URL, database, execute, store_for
from tickler.config import Settings
from tickler.scheduler.db import libpq_url
from tickler.scheduler.migrate import code_files
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import QueueSettings, Store

QUEUE = "bench"
CHUNK = 500_000
SPREAD_MINUTES = 30 * 24 * 60

_LOAD = """
INSERT INTO tickler_event (queue, item_key, schedule_on, enqueued_by, max_attempts)
SELECT %(queue)s, 'k' || n, now() + make_interval(secs => (n::bigint * 7919 %% %(spread)s) * 60 + n %% 60), 'bench', 10
FROM generate_series(%(first)s::integer, %(last)s::integer) AS n
"""


def load(url: str, events: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for first in range(1, events + 1, CHUNK):
            last = min(first + CHUNK - 1, events)
            conn.execute(_LOAD, {"queue": QUEUE, "spread": SPREAD_MINUTES, "first": first, "last": last})
            print(f"  {last:,} events ({time.perf_counter() - started:.0f} s)", flush=True)
        conn.execute("SELECT tickler_fold_due_counts()")
        conn.execute("VACUUM ANALYZE tickler_event")
        conn.execute("VACUUM ANALYZE tickler_due_count")
    return time.perf_counter() - started


def forecast_ms(store: Store, hours: int, bucket: str, runs: int = 50) -> tuple[float, int]:
    found = store.forecasts.forecast(QUEUE, hours=hours, bucket=bucket)  # warm: plans, pool
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        found = store.forecasts.forecast(QUEUE, hours=hours, bucket=bucket)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), sum(b.count for b in found.buckets) + found.later


def _triggers(without_forecast: bool) -> str:
    [triggers] = [f for f in code_files() if f.name == "event_triggers.sql"]
    if not without_forecast:
        return triggers.sql
    # The statements that keep tickler_due_count, taken out: the write path without them.
    stripped = re.sub(r"\n    PERFORM tickler_count_due\(.*?\) AS due;\n", "\n", triggers.sql, flags=re.DOTALL)
    assert "tickler_count_due" not in stripped
    return stripped


def batch_ms(url: str, store: Store, spacing_seconds: int, rounds: int = 20) -> dict[str, tuple[float, float]]:
    """1,000-event batches, their events `spacing_seconds` apart, with and without the counters."""
    queue = store.queues.get(QUEUE)
    now = datetime.now(UTC)
    times: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(rounds):
        for side in ("before", "after"):
            execute(url, _triggers(side == "before"))
            events = [
                NewEvent(
                    item_key=f"b{spacing_seconds}{side}{r}-{i}",
                    data={"i": i},
                    schedule_on=now + timedelta(seconds=spacing_seconds * i),
                )
                for i in range(1000)
            ]
            started = time.perf_counter()
            store.events.schedule_batch(queue, events, actor="bench")
            times[side].append((time.perf_counter() - started) * 1000)
    execute(url, _triggers(False))
    return {side: (statistics.median(values), min(values)) for side, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forecast", description=__doc__)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--database-url", default=DEFAULT_URL, help="server on which a database is created")
    args = parser.parse_args()
    with database(args.database_url) as url, store_for(url, pool_size=2) as store:
        store.queues.put(QUEUE, QueueSettings(), Settings())
        print(f"loading {args.events:,} pending events over {SPREAD_MINUTES // 1440} days")
        seconds = load(url, args.events)
        print(f"loaded in {seconds:.0f} s")
        for hours, bucket in ((24, "hour"), (168, "hour"), (168, "minute")):
            ms, total = forecast_ms(store, hours, bucket)
            print(f"forecast hours={hours} bucket={bucket}: median {ms:.1f} ms ({total:,} pending events)")
        # ~10 hours (the events of a batch in 10 hours) and ~30 days (in 720 hours: the most rows)
        for spacing, spread in ((37, "10 hours"), (2593, "30 days")):
            costs = batch_ms(url, store, spacing)
            for side, label in (("before", "without the forecast's counters"), ("after", "with them")):
                median, fastest = costs[side]
                print(f"1,000-event batch over {spread} {label}: median {median:.1f} ms, fastest {fastest:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
