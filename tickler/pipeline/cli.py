"""`tickler pipeline report|archive|compact|erase|import`: the Spark jobs from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from contextlib import nullcontext
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import psycopg

from tickler.config import Settings
from tickler.pipeline.db import STATEMENT_TIMEOUT_ENV
from tickler.pipeline.limits import InputRefused, MaxInvalid
from tickler.pipeline.progress import jvm_output_to, reporting
from tickler.pipeline.source import choose
from tickler.pipeline.spark import PipelineError, check_master, create_session, jdbc_jar, log_cause, one_line
from tickler.pipeline.watchdog import Deadline
from tickler.scheduler import rules
from tickler.scheduler.db import NoDatabase, existing_database_url
from tickler.scheduler.migrate import MigrationError, migrate


class UsageError(PipelineError):
    """A bad command line: argparse's message, raised instead of printed so --json can carry it."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    """argparse, raising UsageError rather than exiting (its subcommands are of this class too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", self.format_usage())


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tickler pipeline",
        description="Spark jobs over tickler's history. The database is TICKLER_DATABASE_URL, "
        "else the embedded one under TICKLER_DATA_DIR.",
    )
    common = _Parser(add_help=False)
    spark = common.add_argument_group("spark")
    spark.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    spark.add_argument(
        "--source",
        choices=("auto", "jdbc", "snapshot"),
        default="auto",
        help="how PostgreSQL is read: JDBC (TCP + driver jar) or a COPY snapshot (default auto)",
    )
    spark.add_argument(
        "--jdbc-jar",
        help="the PostgreSQL JDBC driver jar (default TICKLER_JDBC_JAR, else /usr/share/java/postgresql.jar)",
    )
    spark.add_argument("--partitions", type=int, help="partitions for reads and loads (default: 2 per core)")
    spark.add_argument("--staging-dir", help="where the snapshot source writes its files (shared, on a cluster)")
    spark.add_argument("--driver-memory", help="Spark driver memory (default 2g in local mode)")
    spark.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="any Spark setting")
    spark.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up after this long: cancel the Spark jobs and exit with status 1 (default: no limit)",
    )
    run = common.add_argument_group("output")
    run.add_argument("--json", action="store_true", help="print a JSON run summary on stdout (and nothing else)")
    run.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    run.add_argument(
        "--spark-log",
        help="where the JVM's own output goes (default: tickler-pipeline-spark.log in the temporary directory)",
    )
    jobs = parser.add_subparsers(dest="job", required=True)

    report = jobs.add_parser("report", parents=[common], help="delivery report: Parquet tables and an HTML page")
    report.add_argument("--since", type=date.fromisoformat, help="first day, UTC (default: 30 days before --until)")
    report.add_argument("--until", type=date.fromisoformat, help="day after the last one (default: tomorrow)")
    report.add_argument("--out", default="tickler-report", help="output directory (default ./tickler-report)")
    report.add_argument("--top", type=int, default=10, help="how many groups and principals to list")

    archive = jobs.add_parser("archive", parents=[common], help="move finished events to Parquet, then delete them")
    compact = jobs.add_parser("compact", parents=[common], help="merge the small files of each archive partition")
    for job in (archive, compact):
        job.add_argument(
            "--to",
            default=os.environ.get("TICKLER_ARCHIVE_DIR", "tickler-archive"),
            help="archive location: a directory or a URI (default TICKLER_ARCHIVE_DIR or ./tickler-archive)",
        )
    compact.add_argument("--min-files", type=int, default=2, help="merge partitions with at least this many files")
    jobs.add_parser("erase", parents=[common], help="rewrite the archive's files for the erasures done in the database")
    when = archive.add_mutually_exclusive_group()
    when.add_argument("--before", help="archive events finished before this RFC 3339 time or date (UTC)")
    when.add_argument(
        "--older-than-days",
        type=float,
        default=30.0,
        help="archive events finished more than this many days ago (default 30)",
    )
    archive.add_argument("--limit", type=int, help="at most this many events in this run")

    load = jobs.add_parser("import", parents=[common], help="schedule events from a CSV or Parquet file")
    load.add_argument("file", help="CSV (with a header) or Parquet file or directory")
    load.add_argument("--principal", required=True, help="recorded as enqueued_by and as the timeline actor")
    load.add_argument("--on-conflict", choices=rules.SCHEDULE_ON_CONFLICT, default="reject")
    load.add_argument(
        "--debounce-max-seconds",
        type=float,
        help="with --on-conflict debounce: due at the latest this long after first enqueued",
    )
    load.add_argument("--queue", help="queue of rows that do not name one")
    load.add_argument("--format", choices=("csv", "parquet"), help="default: by the file name (.csv or not)")
    load.add_argument("--rejects", help="rejects file (default FILE.rejects.csv)")
    load.add_argument(
        "--max-invalid",
        type=_max_invalid,
        metavar="N|P%",
        help="refuse the whole file, writing nothing, when more than N rows (or P%% of them) fail the row checks",
    )
    return parser  # fmt: skip


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of seconds, not {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"takes a positive number of seconds, not {text!r}")
    return seconds


def _max_invalid(text: str) -> MaxInvalid:
    try:
        return MaxInvalid.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _conf(pairs: list[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PipelineError(f"--conf takes KEY=VALUE, not {pair!r}")
        conf[key] = value
    return conf


def _cutoff(args: argparse.Namespace) -> datetime:
    if args.before:
        try:
            return rules.parse_rfc3339(args.before)
        except ValueError:
            try:
                return datetime.combine(date.fromisoformat(args.before), datetime.min.time(), UTC)
            except ValueError:
                raise PipelineError(f"--before takes an RFC 3339 time or a date, not {args.before!r}") from None
    return datetime.now(UTC) - timedelta(days=args.older_than_days)


# Exit statuses (docs/pipeline.md, "Exit status"): what an orchestrator decides on.
OK, FAILED, FIX_FIRST, INPUT_REFUSED = 0, 1, 2, 3
JOBS = ("report", "archive", "compact", "erase", "import")


def main(argv: list[str]) -> int:
    """Run one job; exit status 0 done, 1 the job failed, 2 a problem to fix first, 3 the input refused."""
    wants_json = "--json" in argv
    summary: dict[str, Any] = {"job": next((a for a in argv if a in JOBS), None)}
    try:
        args = _parser().parse_args(argv)
    except UsageError as error:
        if not wants_json:
            print(f"{error.usage}{error}", file=sys.stderr)
            return FIX_FIRST
        return _finish(summary, FIX_FIRST, str(error), as_json=True)
    summary["job"] = args.job
    context: dict[str, Any] = {}

    def give_up() -> None:  # the deadline's last resort: say it, and go now
        _finish(summary, FAILED, f"timed out after {args.timeout:g} s (--timeout); stopped", as_json=args.json)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(FAILED)

    deadline = Deadline(
        args.timeout or float("inf"), cancel=lambda: context["spark"].sparkContext.cancelAllJobs(), give_up=give_up
    )
    try:
        with deadline if args.timeout else nullcontext():
            code = _run(args, summary, context)
    except InputRefused as error:
        code, summary["error"] = INPUT_REFUSED, str(error)
    except (PipelineError, MigrationError, NoDatabase) as error:
        code, summary["error"] = FIX_FIRST, str(error)
    except psycopg.errors.QueryCanceled as error:
        code = FAILED
        summary["error"] = f"the database cancelled a query: {one_line(error)} (see {STATEMENT_TIMEOUT_ENV})"
    except psycopg.OperationalError as error:
        # before Spark starts (or when the database went away later): one line, not a traceback
        code = FIX_FIRST if "spark_started" not in summary else FAILED
        summary["error"] = f"cannot reach the database: {one_line(error)}"
    except Exception as error:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        code = FAILED
        if deadline.expired.is_set():
            summary["error"] = f"timed out after {args.timeout:g} s (--timeout); the Spark jobs were cancelled"
        elif isinstance(error, PySparkException | Py4JError):
            cause = log_cause(Path(summary["spark_log"])) if "spark_log" in summary else None
            summary["error"] = f"Spark failed: {cause or one_line(error)}"
        else:  # a defect of ours: the trace goes to stderr, the summary still to stdout
            traceback.print_exc(file=sys.stderr)
            summary["error"] = f"unexpected {type(error).__name__}: {one_line(error)}"
    summary.pop("spark_started", None)
    return _finish(summary, code, summary.pop("error", None), as_json=args.json)


def _finish(summary: dict[str, Any], code: int, error: str | None, *, as_json: bool) -> int:
    """Say how it ended: one line on stderr, or the JSON summary on stdout."""
    if error and not as_json:
        print(f"tickler pipeline: {error}", file=sys.stderr)
    if as_json:
        ending = {"status": "failed" if code else "ok", "exit_code": code} | ({"error": error} if error else {})
        print(json.dumps({**summary, **ending}, default=str))
    return code


def _run(args: argparse.Namespace, summary: dict[str, Any], context: dict[str, Any]) -> int:
    """Check what can be checked without Spark, start it, run the job; fill `summary`."""
    settings = Settings.from_env()
    # never creates an empty database where none is (only serve and migrate do)
    url = existing_database_url(settings.database_url, settings.data_dir)
    if args.job == "import" and "://" not in args.file and not Path(args.file).exists():
        raise PipelineError(f"no such file: {args.file}")
    migrate(url)
    jar = jdbc_jar(args.jdbc_jar)
    if args.job in ("report", "archive"):
        choose(args.source, url, jar)  # a source that cannot work fails before Spark starts
    check_master(args.master)  # an unreachable master is said now, not after a minute of retries
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    log = Path(args.spark_log or Path(tempfile.gettempdir()) / "tickler-pipeline-spark.log")
    summary["spark_log"] = str(log)
    with jvm_output_to(log):  # the JVM's start-up lines and Spark's logging go there
        spark = create_session(args.master, jar=jar, driver_memory=args.driver_memory, conf=_conf(args.conf))
    summary["spark_started"] = True
    context["spark"] = spark
    try:
        with nullcontext() if args.no_progress else reporting(spark.sparkContext):
            if args.job == "report":
                summary.update(_report(spark, url, args))
            elif args.job == "archive":
                summary.update(_archive(spark, url, args))
            elif args.job == "compact":
                summary.update(_compact(spark, url, args))
            elif args.job == "erase":
                summary.update(_erase(spark, url, args, settings))
            else:
                summary.update(_import(spark, url, args, settings))
    finally:
        if running is None:  # stop only a session this call started
            spark.stop()
    if summary.pop("refused", False):
        return INPUT_REFUSED
    if summary.get("error"):
        return FAILED
    return OK


def _say(args: argparse.Namespace, text: str) -> None:
    """Human output: on stdout, unless --json keeps stdout for the summary."""
    if not args.json:
        print(text)


def _source_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"mode": args.source, "jar": args.jdbc_jar, "partitions": args.partitions, "staging_dir": args.staging_dir}


def _report(spark: Any, url: str, args: argparse.Namespace) -> dict[str, Any]:
    from tickler.pipeline.period import Period
    from tickler.pipeline.report import run_report
    from tickler.pipeline.report_html import percent, seconds
    from tickler.pipeline.source import Source

    until = args.until or datetime.now(UTC).date() + timedelta(days=1)
    since = args.since or until - timedelta(days=30)
    if since >= until:
        raise PipelineError("--since must be before --until")
    with Source(spark, url, **_source_options(args)) as source:
        result = run_report(spark, source, Path(args.out), Period(since, until), top=args.top)
        kind = source.kind
    _say(args, f"report {since} to {until} (read via {kind}): {result.html}")
    _say(args, f"{'queue':<24} {'enqueued':>10} {'delivered':>10} {'cancelled':>10} {'dead':>8} {'fail rate':>9} "
               f"{'late p50':>9} {'late p95':>9} {'late p99':>9}")  # fmt: skip
    for row in result.tables["summary"]:
        _say(args, f"{row['queue']:<24} {row['enqueued']:>10,} {row['delivered']:>10,} {row['cancelled']:>10,} "
                   f"{row['dead']:>8,} {percent(row['failure_rate']):>9} {seconds(row['lateness_p50_s']):>9} "
                   f"{seconds(row['lateness_p95_s']):>9} {seconds(row['lateness_p99_s']):>9}")  # fmt: skip
    return {"since": since, "until": until, "source": kind, "out": str(result.out_dir), "html": str(result.html),
            "queues": result.tables["summary"]}  # fmt: skip


def _archive(spark: Any, url: str, args: argparse.Namespace) -> dict[str, Any]:
    from tickler.pipeline.archive import ArchiveMismatch, SourceOptions, run_archive

    cutoff = _cutoff(args)
    try:
        results = run_archive(
            spark, url, location=args.to, cutoff=cutoff, limit=args.limit, source=SourceOptions(**_source_options(args))
        )
    except ArchiveMismatch as error:
        return {"error": str(error)}
    if not results:
        _say(args, f"nothing finished before {rules.format_timestamp(cutoff)} to archive")
    for run in results:
        note = " (finished a run a crash had left)" if run.resumed else ""
        _say(args, f"archive run {run.run_id}{note}: {run.events:,} events and {run.timeline:,} timeline entries "
                   f"finished before {rules.format_timestamp(run.cutoff)} moved to {run.location}")  # fmt: skip
    return {"cutoff": rules.format_timestamp(cutoff), "runs": [
        {"run": r.run_id, "resumed": r.resumed, "events": r.events, "timeline": r.timeline, "location": r.location}
        for r in results]}  # fmt: skip


def _compact(spark: Any, url: str, args: argparse.Namespace) -> dict[str, Any]:
    from tickler.pipeline.archive import ArchiveMismatch
    from tickler.pipeline.compact import run_compact

    try:
        result = run_compact(spark, url, location=args.to, min_files=args.min_files)
    except ArchiveMismatch as error:
        return {"error": str(error)}
    _say(args, f"compacted {result.partitions:,} partitions of {result.location}: {result.files_before:,} files "
               f"now {result.files_after:,}; {result.runs_checked:,} runs match the ledger")  # fmt: skip
    return {"location": result.location, "partitions": result.partitions, "files_before": result.files_before,
            "files_after": result.files_after, "runs_checked": result.runs_checked}  # fmt: skip


def _erase(spark: Any, url: str, args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from tickler.pipeline.archive import ArchiveMismatch
    from tickler.pipeline.erase import run_erase

    try:
        done = run_erase(spark, url, secret=settings.secret_key)
    except ArchiveMismatch as error:
        return {"error": str(error)}
    for erased in done:
        _say(args, f"erasure {erased.erasure_id}: {erased.rows:,} archive rows rewritten in {erased.files:,} files")
    if not done:
        _say(args, "no erasure waits for the archive")
    return {"erasures": [{"id": e.erasure_id, "archive_rows": e.rows, "files": e.files} for e in done]}


def _import(spark: Any, url: str, args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from tickler.pipeline.importer import run_import

    result = run_import(
        spark, url, args.file, principal=args.principal, on_conflict=args.on_conflict, queue=args.queue,
        debounce_max_seconds=args.debounce_max_seconds, fmt=args.format, rejects_path=args.rejects,
        partitions=args.partitions, max_data_bytes=settings.max_event_data_bytes, max_invalid=args.max_invalid,
    )  # fmt: skip
    _say(args, f"import of {args.file} (principal {args.principal}, on_conflict {args.on_conflict}):")
    for outcome, n in result.counts.items():
        _say(args, f"  {outcome:<10} {n:>12,}")
    _say(args, f"rejects: {result.rejects_path} ({result.rejects:,} rows)")
    summary = {"file": args.file, "rows": result.rows, "counts": result.counts,
               "rejects_file": str(result.rejects_path), "rejects": result.rejects}  # fmt: skip
    if result.rows and not result.valid:
        # nothing could be imported: a cron job must not report success
        summary |= {"refused": True, "error": f"none of the {result.rows:,} rows of {args.file} passed the row checks "
                                              f"(see {result.rejects_path})"}  # fmt: skip
    return summary
