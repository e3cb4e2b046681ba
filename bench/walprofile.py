"""Where the WAL of a delivered event goes: drain N due events with one tickler worker and with the
baseline loop, and break the WAL each wrote down by record type (pg_waldump --stats=record).

    .venv/bin/python -m bench.walprofile [--events 10000] [--batch 100] [--server private|local] [--database-url URL]

Needs a PostgreSQL on this machine whose data directory this user can read (pg_waldump reads the
WAL files). By default (`--server private`) it starts a cluster of its own (bench/cluster.py) with
autovacuum off and removes it at the end. Both drains start right after a CHECKPOINT; how many full-page images
each then writes depends on how many pages it touches first and on when the drain starts against
the checkpoint (on a busy box a drain may begin while the CHECKPOINT runs), so the bytes without
full-page images are printed too: they are the figure that repeats from run to run.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
from typing import Any

import psycopg

from bench import baseline
from bench.cluster import PrivateCluster
from bench.drain import baseline_fill, fill_tickler, make_due_soon
from bench.harness import QUEUE, Context, make_queue, resolve_server, say, wait_until_drained
from bench.procs import WorkerSpec, baseline_drain, tickler_workers


def _value(url: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    """The one value a query returns (on a fresh connection: no stale statistics snapshot)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _lsn(url: str) -> str:
    return str(_value(url, "SELECT pg_current_wal_insert_lsn()::text"))


def _commits(url: str) -> int:
    """Transactions committed in this database so far (every session's, read-only ones too)."""
    return int(_value(url, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))


def _checkpoint(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def _total_bytes(url: str, start: str, end: str) -> int:
    return int(_value(url, "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end, start)))


def _waldump(url: str, start: str, end: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        data_dir = str(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        version = int(str(conn.execute("SHOW server_version_num").fetchone()[0])) // 10000  # type: ignore[index]
        conn.execute("SELECT pg_switch_wal()")  # the end record is in a finished segment
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/{version}/bin/pg_waldump")) or ["pg_waldump"]
    result = subprocess.run(
        [candidates[0], "--stats=record", "-p", os.path.join(data_dir, "pg_wal"), "-s", start, "-e", end],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout or result.stderr


_STATS_LINE = re.compile(r"^(\S+/\S+)\s+(\d+)\s+\(.*?\)\s+\d+\s+\(.*?\)\s+\d+\s+\(.*?\)\s+(\d+)\s+\(")


_TOTAL_LINE = re.compile(r"^Total\s+\d+\s+(\d+)\s+\[.*?\]\s+(\d+)\s+\[")


def record_bytes(dump: str) -> tuple[int, int]:
    """(bytes of the records, bytes of their full-page images) from pg_waldump --stats=record's total."""
    for line in dump.splitlines():
        match = _TOTAL_LINE.match(line.strip())
        if match:
            return int(match.group(1)), int(match.group(2))
    return 0, 0


def _per_type(dump: str) -> dict[str, tuple[int, int]]:
    """{record type: (records, bytes including full-page images)} from pg_waldump --stats=record."""
    found = {}
    for line in dump.splitlines():
        match = _STATS_LINE.match(line.strip())
        if match:
            found[match.group(1)] = (int(match.group(2)), int(match.group(3)))
    return found


def per_event_table(tickler_dump: str, baseline_dump: str, n: int) -> str:
    """Markdown: records and bytes per delivered event by record type, tickler beside the baseline."""
    ours, theirs = _per_type(tickler_dump), _per_type(baseline_dump)
    kinds = sorted(set(ours) | set(theirs), key=lambda k: -(ours.get(k, (0, 0))[1]))
    lines = [
        "| record type | tickler records/event | tickler bytes/event | baseline records/event | baseline bytes/event |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        (a, b), (c, d) = ours.get(kind, (0, 0)), theirs.get(kind, (0, 0))
        if b / n < 5 and d / n < 5:
            continue  # rounding noise: fewer than 5 bytes an event on both sides
        lines.append(f"| {kind} | {a / n:.2f} | {b / n:,.0f} | {c / n:.2f} | {d / n:,.0f} |")
    total_a, total_b = sum(v[1] for v in ours.values()), sum(v[1] for v in theirs.values())
    lines.append(f"| **all** | | **{total_a / n:,.0f}** | | **{total_b / n:,.0f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.walprofile", description=__doc__)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--database-url")
    parser.add_argument(
        "--server",
        choices=["private", "local"],
        help="private: a cluster of our own (bench/cluster.py) with autovacuum off, the default unless "
        "--database-url is given; local: --database-url or the local PostgreSQL",
    )
    args = parser.parse_args(argv)
    if (args.server or ("local" if args.database_url else "private")) == "private":
        cluster = PrivateCluster()
        try:
            url = cluster.start()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET autovacuum = off")
                conn.execute("SELECT pg_reload_conf()")
            return _profile(args, url)
        finally:
            cluster.stop()
    return _profile(args, resolve_server(args.database_url))


def _profile(args: argparse.Namespace, admin_url: str) -> int:
    ctx = Context(admin_url=admin_url, quick=False, repeats=1)
    n = args.events
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        # What a delivered event writes, not what a vacuum that happens to run meanwhile writes.
        # (History and timeline are partitioned by day, and each day by queue: the setting goes on each part.)
        with psycopg.connect(url, autocommit=True) as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT relname FROM pg_class WHERE relkind = 'r' AND (relname IN"
                    " ('tickler_event', 'tickler_timeline', 'tickler_queue', 'tickler_queue_count',"
                    " 'tickler_history_count', 'bench_job')"
                    " OR relname IN (SELECT name FROM tickler_history_partition)"  # a day's parts hold its rows
                    " OR relname IN ('tickler_event_history_default', 'tickler_timeline_default'))"
                )
            ]
            for table in tables:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        room = {"concurrency": max(96, args.batch), "queue_concurrency": max(64, args.batch)}
        specs = [WorkerSpec(url, QUEUE, args.batch, name=f"w{i}", **room) for i in range(args.workers)]  # type: ignore[arg-type]
        with tickler_workers(specs):
            fill_tickler(url, n)
            make_due_soon(url, lead=3.0)  # the drain starts after the checkpoint below
            _checkpoint(url)
            start, commits = _lsn(url), _commits(url)
            wait_until_drained(url)
            end = _lsn(url)
        # read once the workers have exited: a backend reports its counters on exit (idle ones later)
        tickler_commits = _commits(url) - commits
        tickler = (start, end, _total_bytes(url, start, end))
        tickler_dump = _waldump(url, start, end)

        baseline_fill(url, n)
        make_due_soon(url, lead=0.0, table="bench_job")
        _checkpoint(url)
        start, commits = _lsn(url), _commits(url)
        baseline_drain(url, QUEUE, workers=args.workers, batch=args.batch)
        end, base_commits = _lsn(url), _commits(url) - commits
        base = (start, end, _total_bytes(url, start, end))
        base_dump = _waldump(url, start, end)

    print(f"# WAL per delivered event, {n:,} events due at once, batch {args.batch}, {args.workers} worker(s)\n")
    print(f"tickler:  {tickler[2] / n:,.0f} bytes/event, {tickler_commits / n:.3f} commits/event")
    print(f"baseline: {base[2] / n:,.0f} bytes/event, {base_commits / n:.3f} commits/event")
    print(f"ratio:    {tickler[2] / base[2]:.2f}")
    (ours, ours_fpi), (theirs, theirs_fpi) = record_bytes(tickler_dump), record_bytes(base_dump)
    if ours and theirs:
        print(
            f"without full-page images: tickler {ours / n:,.0f}, baseline {theirs / n:,.0f} bytes/event,"
            f" ratio {ours / theirs:.2f} (images: {ours_fpi / n:,.0f} and {theirs_fpi / n:,.0f} bytes/event)"
        )
    print()
    print(per_event_table(tickler_dump, base_dump, n), "\n")
    print("## tickler, pg_waldump --stats=record\n")
    print(tickler_dump)
    print("## baseline, pg_waldump --stats=record\n")
    print(base_dump)
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
