"""python -m bench [--quick] [--only SCENARIO ...] [--server private|local] [--database-url URL] [--soak-minutes M]"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.cluster import SETTINGS, PrivateCluster
from bench.harness import ROOT, Context, Row, resolve_server, say
from bench.load import LoadSampler
from tickler.scheduler.logs import configure_logging

# Scenario name -> module (each has run(ctx) -> list[Row]), in the order of the table.
SCENARIOS = [
    "schedule_http",
    "schedule_batch",
    "claim",
    "groups",
    "pull_http",
    "webhook",
    "webhook_burst",
    "rate_limit",
    "lateness",
    "scale",
    "priority",
    "counts",
    "peers",
    "http_servers",
    "ingest",
    "scaling",
    "soak",
]
RESULTS = ROOT / "bench" / "results.json"
DOC = ROOT / "docs" / "benchmarks.md"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, ~1 minute: proves the harness works")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, metavar="SCENARIO", help=", ".join(SCENARIOS))
    parser.add_argument("--database-url", help="target PostgreSQL server (a database is created per scenario)")
    parser.add_argument(
        "--server",
        choices=["private", "local"],
        help="private: start a cluster of our own with stated settings (bench/cluster.py; the default of a "
        "full run); local: the PostgreSQL at 127.0.0.1:5432 or --database-url, as configured (quick's default)",
    )
    parser.add_argument("--repeats", type=int, help="repeats per measurement (default 3; quick: 1)")
    parser.add_argument("--soak-minutes", type=float, default=30.0, help="soak duration (full mode; default 30)")
    parser.add_argument(
        "--soak-rate", type=int, default=1_000, help="events/s scheduled and delivered by the soak (default 1,000)"
    )
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from bench/results.json")
    parser.add_argument(
        "--note", help="what the report should say about the conditions of this run's scenarios (kept in results.json)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the report (default docs/benchmarks.md; quick mode writes none unless given)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging("WARNING")
    given = args.database_url or os.environ.get("TICKLER_BENCH_DATABASE_URL")
    server = args.server or ("local" if args.quick or given or args.report_only else "private")
    cluster = PrivateCluster() if server == "private" else None
    try:
        admin_url = cluster.start() if cluster else resolve_server(args.database_url)
        if cluster:
            say(f"private PostgreSQL cluster at {admin_url} ({', '.join(f'{k}={v}' for k, v in SETTINGS.items())})")
        return _main(args, admin_url, "private (bench/cluster.py)" if cluster else "local")
    finally:
        if cluster:
            cluster.stop()


def _main(args: argparse.Namespace, admin_url: str, cluster: str) -> int:
    ctx = Context(
        admin_url=admin_url,
        quick=args.quick,
        repeats=args.repeats or (1 if args.quick else 3),
        soak_minutes=0.1 if args.quick else args.soak_minutes,
        soak_rate=args.soak_rate,
    )
    chosen = [] if args.report_only else args.only or SCENARIOS
    results: dict[str, Any] = {}
    if args.report_only and not RESULTS.exists():
        raise SystemExit("no bench/results.json yet: run the benchmarks first")
    if not args.quick and RESULTS.exists():
        results = json.loads(RESULTS.read_text())  # --only reruns update their rows, keep the others
    started = time.monotonic()
    for name in SCENARIOS:
        if name not in chosen:
            continue
        say(f"scenario {name}")
        began = time.monotonic()
        module = importlib.import_module(f"bench.{name}")
        with LoadSampler() as load:
            rows: list[Row] = module.run(ctx)
        results[name] = {
            "rows": [row.as_dict() for row in rows],
            "findings": {k: v for k, v in ctx.findings.items() if k.startswith(name)},
            "seconds": round(time.monotonic() - began, 1),
            "at": time.strftime("%Y-%m-%d %H:%M"),
            "soak_minutes": ctx.soak_minutes if name == "soak" else None,
            "soak_rate": ctx.soak_rate if name == "soak" else None,
            # runs of one report may be days and commits apart: say what each ran on
            "server": report.run_settings(ctx.admin_url),
            "cluster": cluster,
            "commit": report.git_head(),
            # the 1-minute load average while it ran: the rates of a shared box depend on it
            "load": [round(value, 1) for value in load.range()],
            "note": args.note,
        }
        if not args.quick:
            RESULTS.write_text(json.dumps(results, indent=1, default=str))  # an interrupted run keeps these
    say(f"done in {time.monotonic() - started:.0f} s")

    print(report.table([Row(**r) for name in SCENARIOS if name in results for r in results[name]["rows"]]))
    if args.quick and args.output is None:
        return 0
    if not args.quick and not args.report_only:
        RESULTS.write_text(json.dumps(results, indent=1, default=str))
    report.write(args.output or DOC, results, ctx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
