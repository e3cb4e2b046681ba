"""The `tickler` command: serve, worker, migrate, token create."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

import prometheus_client

from config import Settings
from scheduler.db import create_engine, resolve_database_url
from scheduler.delivery.handlers import Handlers
from scheduler.logs import configure_logging
from scheduler.migrate import MigrationError, migrate
from scheduler.rules import check_queue_name
from scheduler.store import Store
from scheduler.worker import Worker


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickler", description="Delayed events with natural keys, on PostgreSQL.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP API and a dispatcher in one process")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--threads", type=int, default=8, help="HTTP worker threads (default 8)")

    worker = commands.add_parser("worker", help="run a dispatcher only (webhooks, and Python handlers if given)")
    worker.add_argument(
        "--handlers",
        metavar="MODULE:OBJECT",
        help="a scheduler.delivery.handlers.Handlers (or Worker) to run in-process",
    )
    worker.add_argument("--no-webhooks", action="store_true", help="do not deliver webhook queues")
    worker.add_argument("--name", help="worker name recorded as claimed_by (default host:pid)")
    worker.add_argument("--concurrency", type=int, default=96, help="delivery threads (default 96)")
    worker.add_argument(
        "--queue-concurrency",
        type=int,
        default=64,
        help="leases of one queue claimed and not yet delivered (default 64; keep it below --concurrency "
        "so that one slow receiver cannot take every thread)",
    )
    worker.add_argument("--batch-size", type=int, default=100, help="leases per claim (default 100)")
    worker.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    worker.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="seconds deliveries in progress may take to finish on SIGTERM (default 10)",
    )
    worker.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="safety poll: look for due events at least this often (default 5 s)",
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
    return parser


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
    except MigrationError as error:
        print(f"tickler: {error}", file=sys.stderr)
        return 2
    return 2


def _pipeline(argv: list[str]) -> int:
    try:
        from pipeline.cli import main as pipeline_main
    except ImportError as error:
        print(f"tickler: the pipeline needs PySpark: pip install 'tickler[pipeline]' ({error})", file=sys.stderr)
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
    url = resolve_database_url(settings.database_url, settings.data_dir)
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
    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port)
    worker = Worker(
        handlers,
        settings=settings,
        name=args.name,
        deliver_webhooks=not args.no_webhooks,
        concurrency=args.concurrency,
        queue_concurrency=args.queue_concurrency,
        batch_size=args.batch_size,
        shutdown_grace=args.shutdown_grace,
        poll_interval=args.poll_interval,
    )
    worker.run()
    return 0


def _token_manage(settings: Settings, command: str, token_id: int | None) -> int:
    url = resolve_database_url(settings.database_url, settings.data_dir)
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

    from api import create_app

    app = create_app(settings, configure_logs=False)
    ext = app.extensions["tickler"]
    worker = Worker(settings=settings, database_url=ext.database_url, engine=ext.store.engine, deliver_webhooks=True)
    worker.start()
    server = waitress.create_server(app, host=host, port=port, threads=threads, ident="tickler")

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    print(f"tickler serving on http://{host}:{server.effective_port}", file=sys.stderr, flush=True)
    try:
        server.run()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        server.close()
        worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
