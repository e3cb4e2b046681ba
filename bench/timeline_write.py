"""The backend CPU of writing timeline entries: the data-modifying CTE each statement had before
migration 0061 against tickler_timeline_write(), 100 entries per statement.

    .venv/bin/python -m bench.timeline_write [--statements 1000] [--rounds 4] [--database-url URL]

Reads the backend's CPU from /proc/<pid>/stat (the server must run on this machine; 10 ms ticks:
many statements per measurement). Prints the CPU per statement of each variant, every round.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import create_database, drop_database, resolve_server, say
from tickler.scheduler.migrate import migrate

_SOURCE = """WITH src AS (
    SELECT 'q' AS queue, 'k' || g AS item_key, CAST(g AS bigint) AS id, now() AS at, g
    FROM generate_series(1, 100) AS g
)"""

VARIANTS = {
    "cte (before 0061)": _SOURCE
    + """, logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, at, 'delivered', 'w', at, jsonb_build_object('lease_id', g) FROM src
)
SELECT count(*) FROM src""",
    "tickler_timeline_write": _SOURCE
    + """, logged AS (
    SELECT tickler_timeline_write(array_agg(
               ROW(queue, item_key, id, at, 'delivered', 'w', at,
                   jsonb_build_object('lease_id', g))::tickler_timeline_row
           )) AS written
    FROM src
)
SELECT count(*) FROM src CROSS JOIN logged""",
    "the array alone": _SOURCE
    + """, logged AS (
    SELECT array_agg(
               ROW(queue, item_key, id, at, 'delivered', 'w', at,
                   jsonb_build_object('lease_id', g))::tickler_timeline_row
           ) AS written
    FROM src
)
SELECT count(*) FROM src CROSS JOIN logged""",
}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, statements: int, rounds: int) -> dict[str, list[float]]:
    """µs of backend CPU per statement of 100 entries, per variant, one value per round."""
    found: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with psycopg.connect(url, autocommit=True) as conn:
        row: Any = conn.execute("SELECT pg_backend_pid()").fetchone()
        pid = int(row[0])
        for _ in range(rounds):
            for name, query in VARIANTS.items():
                before = _cpu_seconds(pid)
                for _ in range(statements):
                    conn.execute(query, prepare=True)
                found[name].append((_cpu_seconds(pid) - before) / statements * 1e6)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--statements", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    admin_url = resolve_server(args.database_url)
    url = create_database(admin_url)
    try:
        migrate(url)
        for name, values in measure(url, args.statements, args.rounds).items():
            say(f"{name}: {', '.join(f'{v:,.0f}' for v in values)} µs of backend CPU per statement of 100 entries")
    finally:
        drop_database(admin_url, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
