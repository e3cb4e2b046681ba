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

import psycopg

from bench import baseline
from bench.cluster import server
from bench.harness import QUEUE, database, execute, make_queue, say, value, wait_until_drained
from bench.procs import baseline_drain, baseline_fill, batch_workers, fill_tickler, make_due_soon, tickler_workers


def _lsn(url: str) -> str:
    return str(value(url, "SELECT pg_current_wal_insert_lsn()::text"))


def _commits(url: str) -> int:
    """Transactions committed in this database so far (every session's, read-only ones too)."""
    return int(value(url, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))


def _total_bytes(url: str, start: str, end: str) -> int:
    return int(value(url, "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end, start)))


def _waldump(url: str, start: str, end: str) -> str:
    data_dir, version = value(url, "SHOW data_directory"), int(value(url, "SHOW server_version_num")) // 10000
    value(url, "SELECT pg_switch_wal()")  # the end record is in a finished segment
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
    private = (args.server or ("local" if args.database_url else "private")) == "private"
    with server(private, args.database_url) as admin_url:
        if private:
            execute(admin_url, "ALTER SYSTEM SET autovacuum = off", "SELECT pg_reload_conf()")
        return _profile(args, admin_url)


def _profile(args: argparse.Namespace, admin_url: str) -> int:
    n = args.events
    with database(admin_url) as url:
        make_queue(url)
        baseline.install(url)
        # What a delivered event writes, not what a vacuum that happens to run meanwhile writes.
        # (History and timeline are partitioned by day, and each day by queue: the setting goes on each part.)
        with psycopg.connect(url, autocommit=True) as conn:
            tables = conn.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND (relname IN"
                " ('tickler_event', 'tickler_timeline', 'tickler_queue', 'tickler_queue_count',"
                " 'tickler_history_count', 'bench_job')"
                " OR relname IN (SELECT name FROM tickler_history_partition)"  # a day's parts hold its rows
                " OR relname IN ('tickler_event_history_default', 'tickler_timeline_default'))"
            ).fetchall()
            for (table,) in tables:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        with tickler_workers(batch_workers(url, args.workers, args.batch)):
            fill_tickler(url, n)
            make_due_soon(url, lead=3.0)  # the drain starts after the checkpoint below
            execute(url, "CHECKPOINT")
            start, commits = _lsn(url), _commits(url)
            wait_until_drained(url)
            end = _lsn(url)
        # read once the workers have exited: a backend reports its counters on exit (idle ones later)
        tickler_commits = _commits(url) - commits
        tickler, tickler_dump = _total_bytes(url, start, end), _waldump(url, start, end)

        baseline_fill(url, n)
        make_due_soon(url, lead=0.0, table="bench_job")
        execute(url, "CHECKPOINT")
        start, commits = _lsn(url), _commits(url)
        baseline_drain(url, QUEUE, workers=args.workers, batch=args.batch)
        end, base_commits = _lsn(url), _commits(url) - commits
        base, base_dump = _total_bytes(url, start, end), _waldump(url, start, end)

    print(f"# WAL per delivered event, {n:,} events due at once, batch {args.batch}, {args.workers} worker(s)\n")
    print(f"tickler:  {tickler / n:,.0f} bytes/event, {tickler_commits / n:.3f} commits/event")
    print(f"baseline: {base / n:,.0f} bytes/event, {base_commits / n:.3f} commits/event")
    print(f"ratio:    {tickler / base:.2f}")
    (ours, ours_fpi), (theirs, theirs_fpi) = record_bytes(tickler_dump), record_bytes(base_dump)
    if ours and theirs:
        print(
            f"without full-page images: tickler {ours / n:,.0f}, baseline {theirs / n:,.0f} bytes/event,"
            f" ratio {ours / theirs:.2f} (images: {ours_fpi / n:,.0f} and {theirs_fpi / n:,.0f} bytes/event)"
        )
    print(f"\n{per_event_table(tickler_dump, base_dump, n)}\n")
    for side, dump in (("tickler", tickler_dump), ("baseline", base_dump)):
        print(f"## {side}, pg_waldump --stats=record\n\n{dump}")
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
