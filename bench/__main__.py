"""python -m bench [--quick] [--only SCENARIO ...] [--server private|local] [--database-url URL] [--report-only]"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from pathlib import Path

from bench import report
from bench.cluster import SETTINGS, server
from bench.cpu import LoadSampler
from bench.harness import Context, Row, say
from tickler.scheduler.logs import configure_logging

# Scenario name -> module (each has run(ctx) -> list[Row]); the report groups them in families.
SCENARIOS = ["schedule_http", "schedule_batch", "claim", "groups", "pull_http", "webhook", "lateness", "peers"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, ~2 minutes: proves the harness works")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, metavar="SCENARIO", help=", ".join(SCENARIOS))
    parser.add_argument("--database-url", help="target PostgreSQL server (a database is created per scenario)")
    parser.add_argument(
        "--server",
        choices=["private", "local"],
        help="private: start a cluster of our own with stated settings (bench/cluster.py; the default of a "
        "full run); local: the PostgreSQL at 127.0.0.1:5432 or --database-url, as configured (quick's default)",
    )
    parser.add_argument("--repeats", type=int, help="repeats per measurement (default 3; quick: 1)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from docs/benchmarks.json")
    parser.add_argument("--note", help="what the page should say about this run's conditions (kept with its rows)")
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the page, and its rows beside it as .json (default docs/benchmarks.md and "
        "docs/benchmarks.json; quick: none): a trial run with --output elsewhere leaves docs/ as it is",
    )
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    if args.report_only:
        if not report.RESULTS.exists():
            raise SystemExit(f"no {report.RESULTS} yet: run the benchmarks first")
        report.write(report.load(), args.output or report.DOC)
        return 0
    given = args.database_url or os.environ.get("TICKLER_BENCH_DATABASE_URL")
    kind = args.server or ("local" if args.quick or given else "private")
    with server(kind == "private", args.database_url) as admin_url:
        if kind == "private":
            say(f"private PostgreSQL cluster at {admin_url} ({', '.join(f'{k}={v}' for k, v in SETTINGS.items())})")
        return _main(args, admin_url, kind)


def _main(args: argparse.Namespace, admin_url: str, cluster: str) -> int:
    ctx = Context(admin_url=admin_url, quick=args.quick, repeats=args.repeats or (1 if args.quick else 3))
    # --only reruns update their rows and keep the others'
    results = {} if args.quick else {k: v for k, v in report.load().items() if k in report.KNOWN}
    facts = {"machine": report.machine(admin_url), "server": report.run_settings(admin_url), "cluster": cluster}
    started = time.monotonic()
    for name in args.only or SCENARIOS:
        say(f"scenario {name}")
        began = time.monotonic()
        with LoadSampler() as load:
            rows: list[Row] = importlib.import_module(f"bench.{name}").run(ctx)
        load_range = [round(value, 1) for value in load.range()]
        results[name] = report.record(rows, time.monotonic() - began, load=load_range, note=args.note, **facts)
        if not args.quick:  # an interrupted run keeps the scenarios it finished
            report.save(results, args.output.with_suffix(".json") if args.output else report.RESULTS)
    say(f"done in {time.monotonic() - started:.0f} s")
    print(report.table([Row(**row) for name in SCENARIOS if name in results for row in results[name]["rows"]]))
    if not args.quick or args.output:
        report.write(results, args.output or report.DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
