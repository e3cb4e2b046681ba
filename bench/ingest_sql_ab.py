"""PostgreSQL's CPU per tickler_schedule() call, before and after a migration, in one run.

    nice -n -10 .venv/bin/python -m bench.ingest_sql_ab --before 61 --modes reject,replace --size 1

Two databases on one private cluster (`track_functions = all`): A migrated through --before, B
through the newest migration; one backend each, autocommit, the prepared statement schedule_one
runs, blocks of calls alternating A and B (the box's load hits both alike). Prints each side's
backend CPU per call from /proc and its pg_stat_user_functions split (wall time: under load, read
the CPU). For the numbers of bench/analysis.md "PostgreSQL's CPU per scheduled event after
migration 0064".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import psycopg

from bench.cluster import PrivateCluster
from bench.harness import create_database, drop_database, make_queue
from tickler.scheduler.migrate import migrate

TICK = os.sysconf("SC_CLK_TCK")
CALL = "SELECT r.ord, r.outcome, (r.event).* FROM tickler_schedule('bench', %s::jsonb, 'probe', %s, NULL, NULL, true) r"


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def keys(mode: str, tag: str, call: int, size: int) -> list[str]:
    if mode in ("replace", "debounce"):
        return [f"{tag}-k{j}-{call % 5}" for j in range(size)]  # 5 keys, changed over and over
    if mode == "ignore":
        return [f"{tag}-k{j}-{call % 50}" for j in range(size)]
    return [f"{tag}-{call}-{j}" for j in range(size)]


def block(conn: psycopg.Connection[Any], mode: str, tag: str, calls: int, size: int) -> None:
    for call in range(calls):
        events = [
            {"ord": j, "item_key": key, "delay_seconds": 3600, "data": {"n": call}}
            for j, key in enumerate(keys(mode, tag, call, size))
        ]
        conn.execute(CALL, [json.dumps(events), mode], prepare=True).fetchall()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=int, default=61, help="side A is migrated through this version")
    parser.add_argument("--modes", default="reject,replace")
    parser.add_argument("--size", type=int, default=1, help="events per call")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=100, help="calls per block")
    args = parser.parse_args()
    cluster = PrivateCluster()
    admin = cluster.start()
    urls: dict[str, str] = {}
    conns: dict[str, tuple[psycopg.Connection[Any], int]] = {}
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET track_functions = 'all'")
            conn.execute("SELECT pg_reload_conf()")
        urls = {f"A (through {args.before})": create_database(admin), "B (newest)": create_database(admin)}
        for (name, url), through in zip(urls.items(), (args.before, None), strict=True):
            migrate(url, through=through)
            make_queue(url)
            conn = psycopg.connect(url, autocommit=True)
            conns[name] = (conn, int(conn.execute("SELECT pg_backend_pid()").fetchone()[0]))  # type: ignore[index]
        for mode in args.modes.split(","):
            used = dict.fromkeys(conns, 0.0)
            for conn, _ in conns.values():
                block(conn, mode, f"warm-{mode}", 30, args.size)
            time.sleep(0.7)  # the warm-up's statistics arrive, then go
            for conn, _ in conns.values():
                conn.execute("SELECT pg_stat_reset()")
            for n in range(args.blocks):
                for name, (conn, pid) in conns.items():
                    before = backend_cpu(pid)
                    block(conn, mode, f"{mode}{n}", args.calls, args.size)
                    used[name] += backend_cpu(pid) - before
            time.sleep(0.7)  # the statistics of the last calls reach pg_stat_user_functions
            calls = args.blocks * args.calls
            print(f"== {mode}, {args.size} event(s) per call, {calls} calls, load {os.getloadavg()[0]:.1f}")
            for name, (conn, _) in conns.items():
                per_call = 1e6 * used[name] / calls
                print(f"{name}: PostgreSQL CPU {per_call:.0f} µs per call, {per_call / args.size:.0f} µs per event")
                for function, count, own, total in conn.execute(
                    "SELECT funcname, calls, self_time, total_time FROM pg_stat_user_functions"
                    " WHERE calls > 0 ORDER BY self_time DESC LIMIT 8"
                ).fetchall():
                    print(
                        f"   {function:30s} {count / calls:5.2f} per call, own {1000 * own / calls:7.1f} µs,"
                        f" with callees {1000 * total / calls:7.1f} µs"
                    )
    finally:
        for conn, _ in conns.values():
            conn.close()
        for url in urls.values():
            drop_database(admin, url)
        cluster.stop()


if __name__ == "__main__":
    main()
