"""Erasing a subject at scale (SPEC §12): the claim probe's latency (schedule one due event, claim
it, ack it, every 10 ms) while an erasure walks a subject's N finished events and N timeline
entries spread over 30 days among as many of other keys, beside the same probe with none running.

    .venv/bin/python -m bench.erasure [--events 1000000] [--server private|local] [--database-url URL]
"""

from __future__ import annotations

import argparse
import threading
import time

import psycopg

from bench.cluster import server
from bench.harness import database, make_queue, percentile, say, store_for
from tickler.scheduler.erasing import Eraser, Hasher, request
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store.erasures import Selector

# Finished events and their `delivered` entries, every other one the subject's (its group), spread
# evenly over the 30 days before now; the days' partitions made first (as maintenance would have).
_SPREAD = "now() - interval '30 days' * (1 - i::float8 / %(n)s)"
SEED = [
    "SELECT tickler_maintain_history(now() - interval '31 days', 33)",
    "INSERT INTO tickler_event_history (id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by,"
    " dequeued_on, dequeued_by, outcome, max_attempts)"
    " SELECT i, 'mail', 'k:' || i, CASE WHEN i %% 2 = 0 THEN 'subject@example.com' END, t, '{\"to\": \"x\"}', t,"
    f" 'bench', t, 'bench', 'delivered', 5 FROM generate_series(1, %(n)s) AS i, LATERAL (SELECT {_SPREAD} AS t) AS x",
    "INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, details)"
    f" SELECT 'mail', 'k:' || i, i, {_SPREAD}, 'delivered', 'bench', '{{}}' FROM generate_series(1, %(n)s) AS i",
]


def probe(url: str, stop: threading.Event, latencies: list[float]) -> None:
    """Schedule, claim and ack one event at a time on the probe's queue; the claims' latencies."""
    with store_for(url, pool_size=2) as store:
        queue = store.queues.get("probe")
        assert queue is not None
        i = 0
        while not stop.is_set():
            i += 1
            store.events.schedule(queue, NewEvent(item_key=f"p{i}", data={}), actor="probe")
            began = time.perf_counter()
            leases = store.leases.claim(queue, worker="probe", limit=1)
            latencies.append(time.perf_counter() - began)
            store.leases.ack([lease.lease_id for lease in leases])
            stop.wait(0.01)


def measure(url: str, seconds: float | None, erase: bool) -> tuple[list[float], float]:
    """The probe's claim latencies over `seconds`, or while an erasure of the subject runs; its time."""
    stop, latencies = threading.Event(), []  # type: ignore[var-annotated]
    thread = threading.Thread(target=probe, args=(url, stop, latencies))
    thread.start()
    began = time.monotonic()
    if erase:
        with store_for(url, pool_size=4) as store:
            selector = Selector(group_key="subject@example.com")
            erasure = request(store.engine, selector, reason="bench", requested_by="bench", secret="bench")
            eraser = Eraser(store.engine, Hasher(store.engine, "bench"))
            while not eraser.run(erasure.id):
                time.sleep(0.2)
            done = eraser.store.get(erasure.id)
        assert done is not None and done.status == "done"
        say(f"erased {done.finished_events:,} finished events and {done.timeline_entries:,} timeline entries")
    else:
        time.sleep(seconds or 0)
    took = time.monotonic() - began
    stop.set()
    thread.join()
    return latencies, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.erasure", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="the subject's events (as many others)")
    parser.add_argument("--server", choices=["private", "local"], default="private")
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    private = args.server == "private" and not args.database_url
    with server(private, args.database_url) as admin_url, database(admin_url) as url:
        make_queue(url, "mail", retention_days=60)
        make_queue(url, "probe")
        began = time.monotonic()
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in SEED:
                conn.execute(statement, {"n": 2 * args.events})  # type: ignore[arg-type]
            conn.execute("VACUUM ANALYZE tickler_event_history")  # as autovacuum would: BRIN summarized
            conn.execute("VACUUM ANALYZE tickler_timeline")
        say(f"seeded {2 * args.events:,} finished events and their entries in {time.monotonic() - began:.0f} s")
        quiet, _ = measure(url, 60.0, erase=False)
        during, took = measure(url, None, erase=True)
    print(f"# claim probe, erasing {args.events:,} events + {args.events:,} timeline entries over 30 days\n")
    print(f"erasure took {took:.1f} s")
    for name, values in (("no erasure", quiet), ("during the erasure", during)):
        p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
        print(f"{name}: {len(values)} claims, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(values) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
