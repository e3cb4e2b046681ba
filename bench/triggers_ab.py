"""PostgreSQL's CPU per enqueued and per delivered event through the store, before and after a
migration, in one run (for migration 0065, one statement trigger per operation on tickler_event).

    .venv/bin/python -m bench.triggers_ab --before 64 [--blocks 8] [--enqueues 200] [--drain 1000]

Two databases on one private cluster (`track_functions = all`): A migrated through --before, B
through the newest migration. Each side runs through its own Store (one pooled connection, so one
backend whose CPU /proc tells), in blocks that alternate A and B (the box's load hits both alike):
- enqueue: `store.events.schedule()` of one new key per call (one transaction per event, what the
  `peers` scenario's in-process enqueue runs); the application's CPU (time.process_time) and the
  backend's per event;
- drain b10 / b100: --drain due events scheduled first (not measured), then claim(limit=batch)
  and ack of the claimed leases until none is left; the backend's CPU per delivered event.
Prints the medians of the blocks and each side's trigger functions from pg_stat_user_functions
(self time per event: wall clock, read beside the CPU).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.cluster import PrivateCluster
from bench.cpu import proc_cpu
from bench.harness import QUEUE, create_database, drop_database, make_queue, median, store_for
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store

TRIGGER_FUNCTIONS = (
    "tickler_count_events",
    "tickler_keep_leases",
    "tickler_keep_leases_inserted",
    "tickler_move_finished",
    "tickler_event_inserted",
    "tickler_event_updated",
    "tickler_event_deleted",
)


class Side:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.store: Store = store_for(url, pool_size=1)
        self.queue = self.store.queues.get(QUEUE)
        self.monitor = psycopg.connect(url, autocommit=True)
        self.seen: dict[int, float] = {}

    def db_cpu(self) -> float:
        """The CPU seconds of every backend of this database but the monitor's, so far (a backend
        that has gone counts with its last value)."""
        pids = self.monitor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        for (pid,) in pids:
            value = proc_cpu(pid)
            if value is not None:
                self.seen[pid] = value
        return sum(self.seen.values())


def _enqueue(side: Side, tag: str, count: int) -> tuple[float, float]:
    """(application, database) CPU µs per event of `count` single-event schedules."""
    app, db = time.process_time(), side.db_cpu()
    for i in range(count):
        side.store.events.schedule(
            side.queue, NewEvent(item_key=f"{tag}-{i}", data={"n": i}, delay_seconds=3600), actor="app"
        )
    return (time.process_time() - app) / count * 1e6, (side.db_cpu() - db) / count * 1e6


def _fill_due(side: Side, tag: str, count: int) -> None:
    past = datetime.now(UTC) - timedelta(minutes=1)
    for start in range(0, count, 1000):
        side.store.events.schedule_batch(
            side.queue,
            [NewEvent(item_key=f"{tag}-{i}", data={"n": i}, schedule_on=past) for i in range(start, start + 1000)][
                : count - start
            ],
            actor="app",
        )


def _drain(side: Side, batch: int, count: int) -> float:
    """Database CPU µs per delivered event of claiming and acking `count` due events."""
    db, done = side.db_cpu(), 0
    while done < count:
        leases = side.store.leases.claim(side.queue, worker="w", limit=min(batch, count - done))
        assert leases, (done, count)
        side.store.leases.ack([lease.lease_id for lease in leases])
        done += sum(len(lease.events) for lease in leases)
    return (side.db_cpu() - db) / count * 1e6


def _functions(url: str) -> dict[str, tuple[int, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT funcname, calls, self_time FROM pg_stat_user_functions WHERE funcname = ANY(%s)",
            [list(TRIGGER_FUNCTIONS)],
        ).fetchall()
    return {name: (int(calls), float(own)) for name, calls, own in rows}


def _flush(side: Side) -> None:
    """The store's backend reports its statistics (at the end of a transaction, at most once a
    second): wait a second and end one."""
    time.sleep(1.1)
    with side.store.engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")


def _reset(side: Side) -> None:
    _flush(side)
    side.monitor.execute("SELECT pg_stat_reset()")


def _report(title: str, results: dict[str, list[float]], events: int, functions: dict[str, Any]) -> None:
    print(f"== {title}, load {os.getloadavg()[0]:.1f}")
    for name, values in results.items():
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{name}: median {median(values):,.0f} µs per event (blocks: {runs})")
        for function, (calls, own) in sorted(functions[name].items()):
            print(f"   {function:30s} {calls / events:5.2f} calls/event, own {1000 * own / events:6.1f} µs/event")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=int, default=64, help="side A is migrated through this version")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--enqueues", type=int, default=200, help="schedules per block")
    parser.add_argument("--drain", type=int, default=1000, help="events per drain block")
    parser.add_argument("--batches", default="10,100")
    args = parser.parse_args()
    cluster = PrivateCluster()
    admin = cluster.start()
    sides: list[Side] = []
    urls: list[str] = []
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET track_functions = 'all'")
            conn.execute("SELECT pg_reload_conf()")
        for name, through in ((f"A (through {args.before})", args.before), ("B (newest)", None)):
            url = create_database(admin)
            urls.append(url)
            migrate(url, through=through)
            make_queue(url)
            sides.append(Side(name, url))
        print(f"load at start {os.getloadavg()[0]:.1f}")

        for side in sides:
            _enqueue(side, "warm", 100)
        for side in sides:
            _reset(side)
        app: dict[str, list[float]] = {side.name: [] for side in sides}
        db: dict[str, list[float]] = {side.name: [] for side in sides}
        for n in range(args.blocks):
            for side in sides if n % 2 == 0 else reversed(sides):
                a, d = _enqueue(side, f"b{n}", args.enqueues)
                app[side.name].append(a)
                db[side.name].append(d)
        for side in sides:
            _flush(side)
        events = args.blocks * args.enqueues
        functions = {side.name: _functions(side.url) for side in sides}
        _report("enqueue, one event per transaction: application CPU", app, events, {key: {} for key in app})
        _report("enqueue, one event per transaction: PostgreSQL CPU", db, events, functions)

        for batch in (int(b) for b in args.batches.split(",") if b):
            drains: dict[str, list[float]] = {side.name: [] for side in sides}
            for side in sides:  # every block's events, due, first; then a warm-up drain
                _fill_due(side, f"d{batch}", (args.blocks + 1) * args.drain)
                _drain(side, batch, args.drain)
            for side in sides:
                _reset(side)
            for n in range(args.blocks):
                for side in sides if n % 2 == 0 else reversed(sides):
                    drains[side.name].append(_drain(side, batch, args.drain))
            for side in sides:
                _flush(side)
            functions = {side.name: _functions(side.url) for side in sides}
            _report(
                f"drain, batch {batch}: PostgreSQL CPU per delivered event (claim + ack)",
                drains,
                args.blocks * args.drain,
                functions,
            )
    finally:
        for side in sides:
            side.store.engine.dispose()
            side.monitor.close()
        for url in urls:
            drop_database(admin, url)
        cluster.stop()


if __name__ == "__main__":
    main()
