"""What an ack's `delivered` timeline row costs (issue #21): a PROTOTYPE measurement, not a
scenario of the report.

    .venv/bin/python -m bench.prototypes.ack_without_timeline_row [--blocks 10] [--events 2000] [--batch 10]

Two databases on one private cluster (bench/cluster.py), both migrated to the newest migration:
A acks with scheduler/queries.sql's ack_leases; B with the same statement without its timeline
write (`logged`), on a history that has the index a key's entries in history would need
(queue, item_key, id). Blocks alternate A and B; each claims and acks --events due events at
--batch per claim through the store, and prints the backend's CPU (/proc) and the WAL it wrote
(LSN difference) per delivered event. B is the floor of the design in
bench/prototypes/delivered_entry_in_history.diff (which also writes an 8-byte entry id).
"""

from __future__ import annotations

import argparse

import psycopg

from bench.cluster import PrivateCluster
from bench.harness import create_database, drop_database, make_queue, median
from bench.triggers_ab import Side, _fill_due
from tickler.scheduler.db import driver_rows
from tickler.scheduler.migrate import migrate
from tickler.scheduler.sql import driver_sql


def without_timeline_write(statement: str) -> str:
    """ack_leases without its `logged` CTE (the timeline write) and the join that runs it."""
    start, end = statement.index("logged AS ("), statement.index("wake AS (")
    return (statement[:start] + statement[end:]).replace(" CROSS JOIN logged AS l", "")


def drain(side: Side, statement: str, batch: int, count: int) -> tuple[float, float]:
    """(backend CPU µs, WAL bytes) per event of claiming and acking `count` due events."""
    cpu, done = side.db_cpu(), 0
    with psycopg.connect(side.url, autocommit=True) as monitor:
        start = monitor.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        while done < count:
            leases = side.store.leases.claim(side.queue, worker="w", limit=min(batch, count - done))
            assert leases, (done, count)
            params = {"lease_ids": [lease.lease_id for lease in leases], "queues": None, "now": None, "trace_ids": None}
            driver_rows(side.store.engine, statement, params, tuples=True)
            done += sum(len(lease.events) for lease in leases)
        wal = monitor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), CAST(%s AS pg_lsn))::float8",
            [start[0] if start else None],
        ).fetchone()
    return (side.db_cpu() - cpu) / count * 1e6, float(wal[0] if wal else 0) / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--events", type=int, default=2000, help="events per block")
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    cluster = PrivateCluster()
    admin = cluster.start()
    sides: list[Side] = []
    urls: list[str] = []
    try:
        for name in ("A (ack_leases)", "B (no timeline row)"):
            url = create_database(admin)
            urls.append(url)
            migrate(url)
            make_queue(url)
            if name.startswith("B"):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(
                        "CREATE INDEX tickler_event_history_key ON tickler_event_history (queue, item_key, id)"
                    )
            sides.append(Side(name, url))
        statements = {
            sides[0].name: driver_sql("ack_leases"),
            sides[1].name: without_timeline_write(driver_sql("ack_leases")),
        }
        for side in sides:
            _fill_due(side, "due", (args.blocks + 1) * args.events)
            drain(side, statements[side.name], args.batch, args.events)  # warm-up
        cpu: dict[str, list[float]] = {side.name: [] for side in sides}
        wal: dict[str, list[float]] = {side.name: [] for side in sides}
        for block in range(args.blocks):
            for side in sides if block % 2 == 0 else reversed(sides):
                spent, written = drain(side, statements[side.name], args.batch, args.events)
                cpu[side.name].append(spent)
                wal[side.name].append(written)
        for side in sides:
            print(
                f"{side.name}: PostgreSQL CPU median {median(cpu[side.name]):,.0f} µs per event"
                f" ({', '.join(f'{v:,.0f}' for v in cpu[side.name])}); WAL median {median(wal[side.name]):,.0f}"
                f" bytes per event ({', '.join(f'{v:,.0f}' for v in wal[side.name])})"
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
