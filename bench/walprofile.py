"""Where the WAL of a delivered event goes: drain N due events with one tickler worker and with the
baseline loop, and break the WAL each wrote down by record type (pg_waldump --stats=record).

    .venv/bin/python -m bench.walprofile [--events 10000] [--batch 100] [--database-url URL]

Needs a PostgreSQL on this machine whose data directory this user can read (pg_waldump reads the
WAL files). Both drains start right after a CHECKPOINT, so both pay the same full-page images.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys

import psycopg

from bench import baseline
from bench.drain import baseline_fill, fill_tickler, make_due_soon
from bench.harness import QUEUE, Context, make_queue, resolve_server, say, wait_until_drained
from bench.procs import WorkerSpec, run_baseline_workers, tickler_workers


def _lsn(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _checkpoint(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


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


def _total_bytes(url: str, start: str, end: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end, start)).fetchone()
    assert row is not None
    return int(row[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.walprofile", description=__doc__)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    ctx = Context(admin_url=resolve_server(args.database_url), quick=False, repeats=1, soak_minutes=0)
    n = args.events
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        room = {"concurrency": max(96, args.batch), "queue_concurrency": max(64, args.batch)}
        with tickler_workers([WorkerSpec(url, QUEUE, args.batch, **room)]):  # type: ignore[arg-type]
            fill_tickler(url, n)
            make_due_soon(url, lead=3.0)  # the drain starts after the checkpoint below
            _checkpoint(url)
            start = _lsn(url)
            wait_until_drained(url)
            end = _lsn(url)
        tickler = (start, end, _total_bytes(url, start, end))
        tickler_dump = _waldump(url, start, end)

        baseline_fill(url, n)
        make_due_soon(url, lead=0.0, table="bench_job")
        _checkpoint(url)
        start = _lsn(url)
        run_baseline_workers(url, QUEUE, workers=1, batch=args.batch)
        end = _lsn(url)
        base = (start, end, _total_bytes(url, start, end))
        base_dump = _waldump(url, start, end)

    print(f"# WAL per delivered event, {n:,} events due at once, batch {args.batch}, one worker\n")
    print(f"tickler:  {tickler[2] / n:,.0f} bytes/event")
    print(f"baseline: {base[2] / n:,.0f} bytes/event")
    print(f"ratio:    {tickler[2] / base[2]:.2f}\n")
    print("## tickler, pg_waldump --stats=record\n")
    print(tickler_dump)
    print("## baseline, pg_waldump --stats=record\n")
    print(base_dump)
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
