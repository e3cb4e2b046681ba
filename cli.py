"""The `tickler` command: serve, worker, migrate, token; queues, events and schedules (commands/)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields
from importlib.metadata import PackageNotFoundError, version

import prometheus_client
import structlog

from tickler import commands as ops_commands
from tickler.commands.database import NoDatabase, existing_database_url
from tickler.config import Settings, WorkerSettings
from tickler.scheduler.db import create_engine, resolve_database_url
from tickler.scheduler.delivery.handlers import Handlers
from tickler.scheduler.logs import configure_logging
from tickler.scheduler.migrate import MigrationError, migrate
from tickler.scheduler.queue_metrics import QueueGaugeCollector
from tickler.scheduler.rules import check_queue_name
from tickler.scheduler.store import Store
from tickler.scheduler.worker import Worker

# The tuning knobs (config.WorkerSettings) `tickler worker` takes as options.
WORKER_OPTIONS = ("concurrency", "queue_concurrency", "batch_size", "shutdown_grace", "poll_interval")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickler", description="Delayed events with natural keys, on PostgreSQL.")
    parser.add_argument("--version", action="version", version=f"tickler {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP API and a dispatcher in one process")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"
    )
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0 picks a free one)")
    serve.add_argument("--threads", type=int, default=8, help="HTTP worker threads (default 8)")

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

    token = commands.add_parser("token", help="manage API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="create a token and print it (only it) on stdout")
    create.add_argument("name", help="the principal: the client service this token belongs to")
    create.add_argument("--queue", action="append", default=[], help="a queue it may use (repeatable)")
    create.add_argument("--admin", action="store_true", help="may manage queues and use every queue")
    token_commands.add_parser("list", help="list tokens (ids, names, scopes; never the tokens)")
    revoke = token_commands.add_parser("revoke", help="revoke a token by its id (see `tickler token list`)")
    revoke.add_argument("id", type=int)
    pipeline = commands.add_parser("pipeline", help="Spark jobs: report, archive, import (see `tickler pipeline -h`)")
    pipeline.add_argument("args", nargs=argparse.REMAINDER)
    ops_commands.add_parsers(commands)
    return parser


def _version() -> str:
    try:
        return version("tickler")
    except PackageNotFoundError:
        return "0.0.0"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pipeline"]:
        return _pipeline(argv[1:])
    args = _parser().parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level)
    try:
        if args.command == "serve":
            return _serve(settings, args.host, args.port, args.threads)
        if args.command == "worker":
            return _worker(settings, args)
        if args.command == "migrate":
            return _migrate(settings)
        if args.command == "token" and args.token_command == "create":
            return _token_create(settings, args.name, args.queue, args.admin)
        if args.command == "token":
            return _token_manage(settings, args.token_command, getattr(args, "id", None))
        if args.command in ops_commands.NAMES:
            return ops_commands.run(settings, args)
    except (MigrationError, NoDatabase) as error:
        print(f"tickler: {error}", file=sys.stderr)
        return 2
    return 2


PIPELINE_NEEDS = (
    "tickler pipeline: PySpark is not installed; run `make install` in the clone "
    "(or `pip install 'tickler[pipeline]'`), and have Java 17 or later"
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
    url = resolve_database_url(settings.database_url, settings.data_dir)
    applied = migrate(url)
    print(f"applied {len(applied)} migration(s)", file=sys.stderr)
    return 0


def _token_create(settings: Settings, name: str, queues: list[str], admin: bool) -> int:
    bad = [q for q in queues if check_queue_name(q)]
    if bad:
        print(f"tickler: not a queue name: {bad[0]!r}", file=sys.stderr)
        return 2
    if not 1 <= len(name) <= 200:
        print("tickler: the name must be 1-200 characters", file=sys.stderr)
        return 2
    url = existing_database_url(settings)  # never creates an empty database by mistake
    migrate(url)
    engine = create_engine(url, pool_size=1)
    try:
        print(Store(engine).tokens.create(name, queues=queues, is_admin=admin))
    finally:
        engine.dispose()
    return 0


def _load_handlers(spec: str) -> Handlers:
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
    handlers = _load_handlers(args.handlers) if args.handlers else Handlers()
    database_url = existing_database_url(settings)  # a worker never creates an empty database
    if args.metrics_port:
        # The per-queue gauges too, read from the database at scrape time (SPEC §7: the same
        # values from every process), on a one-connection engine of their own.
        gauge_store = Store(create_engine(database_url, pool_size=1))
        prometheus_client.REGISTRY.register(QueueGaugeCollector(gauge_store.queues))
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


def _token_manage(settings: Settings, command: str, token_id: int | None) -> int:
    url = existing_database_url(settings)  # never creates an empty database by mistake
    migrate(url)
    engine = create_engine(url, pool_size=1)
    try:
        tokens = Store(engine).tokens
        if command == "revoke":
            assert token_id is not None
            info = tokens.revoke(token_id)
            if info is None:
                print(f"tickler: no token {token_id}", file=sys.stderr)
                return 1
            print(f"revoked token {info.id} of {info.principal}")
            return 0
        for info in tokens.list():
            scope = "admin" if info.is_admin else ",".join(info.queues) or "(no queues)"
            state = f"revoked {info.revoked_on:%Y-%m-%d}" if info.revoked_on else "active"
            print(f"{info.id}\t{info.principal}\t{scope}\t{state}")
        return 0
    finally:
        engine.dispose()


def _serve(settings: Settings, host: str, port: int, threads: int) -> int:
    """The API and a webhook dispatcher in one process; SIGTERM stops both gracefully."""
    import waitress

    from tickler.api import create_app

    app = create_app(settings, configure_logs=False)
    ext = app.extensions["tickler"]
    worker = Worker(settings=settings, database_url=ext.database_url, engine=ext.store.engine, deliver_webhooks=True)
    worker.start()
    server = waitress.create_server(app, host=host, port=port, threads=threads, ident="tickler")

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(0)

    # SIGINT too, explicitly: a shell starts a background job (`tickler serve &`) with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler for it.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    structlog.get_logger("tickler.serve").info(
        "serving", url=f"http://{host}:{server.effective_port}", pid=os.getpid(), threads=threads
    )
    try:
        server.run()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        server.close()
        worker.stop()
        # The LISTEN connections stop before the embedded PostgreSQL, or they log a lost connection.
        app.extensions["tickler.pull"].stop()
        listener = app.extensions.get("tickler.listener")
        if listener is not None:
            listener.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
