"""Claim throughput on the primary while clients search and read timelines: the reads on a
replica (TICKLER_READ_DATABASE_URL) vs on the primary.

    python -m bench.replica_reads --primary URL --replica URL [--events 30000] [--clients 20]

`--primary` and `--replica` name the admin database of a primary and of its streaming standby
(the bench creates, migrates and drops a database of its own on the primary; the replica sees it
by replication). Not part of `python -m bench`'s report: it needs a replicated pair, which the
private cluster of a full run is not. Each run: one tickler worker (its own process, batch 100)
drains `--events` events that fall due at one instant, while `--clients` threads of this process
search the queue (a page of 50) and read the timeline of a key they found, through a Store whose
reads go to the replica, or to the primary; the claim rate, the reads answered and where they
went are printed, beside a run with no readers (the rate the ratio is of).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from sqlalchemy.engine import make_url

from bench.harness import QUEUE, database, finish_time, make_queue, median, poll, wait_until_drained, with_database
from bench.procs import WorkerSpec, fill_tickler, make_due_soon, tickler_workers
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.logs import configure_logging
from tickler.scheduler.replica import read_engines
from tickler.scheduler.store import SearchFilter, Store


def _read_until(stop: threading.Event, store: Store, count: list[int], lock: threading.Lock, cpus: set[int]) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)  # this thread only
    done = 0
    while not stop.is_set():
        page = store.events.search(QUEUE, SearchFilter(limit=50))
        if page:
            store.events.timeline(QUEUE, page[0].item_key)
        done += 1
    with lock:
        count[0] += done


def run_once(
    primary_admin: str, replica_admin: str | None, *, events: int, clients: int, readers_cpus: set[int] | None = None
) -> tuple[str, float, float]:
    """Where the reads went, the claims/s of the drain and the reads/s meanwhile."""
    with database(primary_admin) as url:
        make_queue(url)
        read_url = with_database(replica_admin, str(make_url(url).database)) if replica_admin else ""
        settings = Settings(database_url=url, read_database_url=read_url, pool_size=max(1, clients))
        engine = create_engine(url, pool_size=max(1, clients))
        reads = read_engines(engine, settings)
        store = Store(engine, reads)
        try:
            with tickler_workers([WorkerSpec(url, QUEUE, 100, concurrency=128, queue_concurrency=100)]):
                fill_tickler(url, events)
                if replica_admin:  # the replica has the events before the clock starts
                    poll(lambda: reads.engine() is reads.replica, what="replica lag", timeout=60, interval=0.2)
                stop, lock, count = threading.Event(), threading.Lock(), [0]
                args = (stop, store, count, lock, readers_cpus or set())
                readers = [threading.Thread(target=_read_until, args=args, daemon=True) for _ in range(clients)]
                for reader in readers:
                    reader.start()
                started = time.monotonic()
                due = make_due_soon(url)
                wait_until_drained(url)
                elapsed = time.monotonic() - started
                on_replica = reads.on_replica
                stop.set()
                for reader in readers:
                    reader.join(30)
            claimed = events / (finish_time(url) - due)
        finally:
            store.dispose()
    where = ("replica" if replica_admin else "primary") if clients else "no readers"
    return where + (" (fell back)" if where == "replica" and not on_replica else ""), claimed, count[0] / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replica_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--primary", required=True, help="the primary's admin URL")
    parser.add_argument("--replica", required=True, help="its streaming standby's admin URL")
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--pin", action="store_true", help="this process and the worker on CPU 0, readers on CPU 1")
    args = parser.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {0})  # the worker process spawned from here inherits it
    configure_logging("WARNING")
    results = [
        run_once(args.primary, replica, events=args.events, clients=clients, readers_cpus={1} if args.pin else None)
        for _ in range(args.repeats)
        for replica, clients in ((None, 0), (None, args.clients), (args.replica, args.clients))
    ]
    alone = median([claimed for where, claimed, _ in results if where == "no readers"])
    print(f"{'reads on':<12} {'claimed/s':>10} {'x alone':>8} {'reads/s':>9}  (a read: a page of 50 and a timeline)")
    for where, claimed, reads in results:
        print(f"{where:<12} {claimed:>10,.0f} {claimed / alone:>8.2f} {reads:>9,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
