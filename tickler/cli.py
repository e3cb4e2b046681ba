"""The `tickler` command: serve, worker, migrate, token; queues, events and schedules (commands/)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from tickler.commands.failures import Refused, databases, describe_database, explain
from tickler.config import Settings, SettingsError, WorkerSettings

if TYPE_CHECKING:
    from tickler.scheduler.delivery.handlers import Handlers

# What each subcommand needs is imported when it runs: `tickler --version` or a `queues list`
# should not pay for the HTTP app, the dispatcher and the metrics.

# The tuning knobs (config.WorkerSettings) `tickler worker` takes as options.
WORKER_OPTIONS = ("concurrency", "queue_concurrency", "batch_size", "shutdown_grace", "poll_interval")


def _parser() -> argparse.ArgumentParser:
    from tickler import commands as ops_commands
    from tickler.commands import tokens

    parser = argparse.ArgumentParser(prog="tickler", description="Delayed events with natural keys, on PostgreSQL.")
    parser.add_argument("--version", action=_Version, help="show tickler's version and exit")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP API and a dispatcher, in each of its web processes")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"
    )
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0 picks a free one)")
    serve.add_argument("--threads", type=int, default=8, help="HTTP worker threads of each web process (default 8)")
    serve.add_argument(
        "--web-processes",
        type=int,
        help="processes answering HTTP on the port, each with a dispatcher (default: 2, or 1 on a one-core machine)",
    )

    worker = commands.add_parser("worker", help="run a dispatcher only (webhooks, and Python handlers if given)")
    worker.add_argument(
        "--handlers",
        metavar="MODULE:OBJECT",
        help="a scheduler.delivery.handlers.Handlers (or Worker) to run in-process",
    )
    worker.add_argument("--no-webhooks", action="store_true", help="do not deliver webhook queues")
    worker.add_argument("--name", help="worker name recorded as claimed_by (default host:pid)")
    worker.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    knobs = {knob.name: knob for knob in fields(WorkerSettings)}
    for name in WORKER_OPTIONS:
        knob = knobs[name]
        worker.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(knob.default),
            help=f"{knob.metadata['meaning']}; default {knob.default:g}, or TICKLER_WORKER_{name.upper()}",
        )

    commands.add_parser("migrate", help="apply pending database migrations (safe to run concurrently)")

    tokens.add_parser(commands)
    pipeline = commands.add_parser("pipeline", help="Spark jobs: report, archive, import (see `tickler pipeline -h`)")
    pipeline.add_argument("args", nargs=argparse.REMAINDER)
    ops_commands.add_parsers(commands)
    return parser


class _Version(argparse.Action):
    """argparse's version action, with the version read when asked for (importlib.metadata is
    slow to import, and every other command would pay for it to build the parser)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help")))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"tickler {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tickler")
    except PackageNotFoundError:
        return "0.0.0"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:
        # The reader went away (`tickler events list --json | head`): it had what it wanted.
        # Python would report the pipe again when it flushes stdout at exit: point it elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    if argv == ["--version"]:  # answered before the subcommands (and the store) are imported
        print(f"tickler {_version()}")
        return 0
    if argv[:1] == ["pipeline"]:
        return _pipeline(argv[1:])
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        print(f"tickler: {error}", file=sys.stderr)
        return 2
    from tickler import commands as ops_commands

    if not ops_commands.plain(args):
        # A plain read logs nothing: it leaves structlog (and what it loads) unimported.
        from tickler.scheduler.logs import configure_logging

        configure_logging(settings.log_level, settings.log_format)
    try:
        return _run(settings, args)
    except Refused as refusal:
        print(f"tickler: {refusal}", file=sys.stderr)
        return refusal.exit_code
    except KeyboardInterrupt:
        print("tickler: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        from tickler.scheduler.db import NoDatabase
        from tickler.scheduler.migrate import MigrationError

        message = str(error) if isinstance(error, MigrationError | NoDatabase) else explain(error, settings)
        if message is None:
            raise  # a bug: its traceback is what a report needs
        print(f"tickler: {message}", file=sys.stderr)
        return 2


def _run(settings: Settings, args: argparse.Namespace) -> int:
    from tickler import commands as ops_commands
    from tickler.commands import tokens

    if args.command == "serve":
        from tickler.commands.serve import serve

        return serve(settings, args.host, args.port, args.threads, args.web_processes)
    if args.command == "worker":
        return _worker(settings, args)
    if args.command == "migrate":
        return _migrate(settings)
    if args.command == "token":
        return tokens.run(settings, args)
    if args.command in ops_commands.NAMES:
        return ops_commands.run(settings, args)
    return 2


PIPELINE_NEEDS = (
    "tickler pipeline: PySpark is not installed; run `make install` in the clone "
    "(or install tickler's wheel with its extra: `pip install 'tickler-VERSION-py3-none-any.whl[pipeline]'`, "
    "from `make dist`), and have Java 17 or later"
)


def _pipeline(argv: list[str]) -> int:
    # The jobs import PySpark only once they run: look for it first, so that a newcomer who
    # installed the service alone (`make serve`) gets one line, not a chained traceback.
    if importlib.util.find_spec("pyspark") is None and not {"-h", "--help"} & set(argv):
        print(PIPELINE_NEEDS, file=sys.stderr)
        return 2
    try:
        from tickler.pipeline.cli import main as pipeline_main
    except ImportError as error:
        print(f"{PIPELINE_NEEDS} ({error})", file=sys.stderr)
        return 2
    return pipeline_main(argv)


def _migrate(settings: Settings) -> int:
    from tickler.scheduler.db import resolve_database_url
    from tickler.scheduler.migrate import migrate

    # Which server and database, before touching it: `postgres://localhost` means the database
    # named after the OS user, which nobody should have to guess.
    print(f"tickler migrate: database {describe_database(settings)}", file=sys.stderr)
    started = time.monotonic()
    applied = migrate(
        resolve_database_url(settings.database_url, settings.data_dir),
        connect_timeout=settings.connect_timeout,
        # Each step as it is applied (a long one is then seen to be running, not hanging).
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if applied:
        print(
            f"applied {len(applied)} step(s) in {time.monotonic() - started:.1f} s, up to {applied[-1].label}",
            file=sys.stderr,
        )
    else:
        print("nothing to apply: the database is up to date", file=sys.stderr)
    return 0


def _load_handlers(spec: str) -> Handlers:
    from tickler.scheduler.delivery.handlers import Handlers
    from tickler.scheduler.worker import Worker

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"tickler: --handlers takes MODULE:OBJECT, not {spec!r}")
    sys.path.insert(0, os.getcwd())
    found = getattr(importlib.import_module(module_name), attribute)
    if isinstance(found, Worker):
        return found.handlers
    if not isinstance(found, Handlers):
        raise SystemExit(f"tickler: {spec} is a {type(found).__name__}, not a Handlers or Worker")
    return found


def _worker(settings: Settings, args: argparse.Namespace) -> int:
    import prometheus_client
    import structlog

    from tickler.commands.database import existing_database_url
    from tickler.scheduler.db import create_engine
    from tickler.scheduler.delivery.handlers import Handlers
    from tickler.scheduler.queue_metrics import QueueGaugeCollector
    from tickler.scheduler.replica import ReplicaLagCollector, read_engines
    from tickler.scheduler.store import Store
    from tickler.scheduler.worker import Worker

    handlers = _load_handlers(args.handlers) if args.handlers else Handlers()
    # every host of the URL (never the password), before reaching it: a failure names what it tried
    structlog.get_logger("tickler.worker").info("database", **databases(settings))
    database_url = existing_database_url(settings)  # a worker never creates an empty database
    if args.metrics_port:
        # The per-queue gauges too, read from the database at scrape time (SPEC §7: the same
        # values from every process), on a one-connection engine of their own.
        gauge_engine = create_engine(database_url, pool_size=1, connect_timeout=settings.connect_timeout)
        reads = read_engines(gauge_engine, settings, pool_size=1)
        prometheus_client.REGISTRY.register(QueueGaugeCollector(Store(gauge_engine, reads).queues))
        prometheus_client.REGISTRY.register(ReplicaLagCollector(reads))
        prometheus_client.start_http_server(args.metrics_port)
    worker = Worker(
        handlers,
        settings=settings,
        database_url=database_url,
        name=args.name,
        deliver_webhooks=not args.no_webhooks,
        # the knobs given here; the others are the settings' (TICKLER_WORKER_* or the defaults)
        **{knob: getattr(args, knob) for knob in WORKER_OPTIONS if getattr(args, knob) is not None},
    )
    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
