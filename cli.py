"""The `tickler` command: serve, worker, migrate, token create."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from config import Settings
from scheduler.db import create_engine, resolve_database_url
from scheduler.logs import configure_logging
from scheduler.migrate import MigrationError, migrate
from scheduler.rules import check_queue_name
from scheduler.store import Store


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickler", description="Delayed events with natural keys, on PostgreSQL.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP API and a dispatcher in one process")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--threads", type=int, default=8, help="HTTP worker threads (default 8)")

    commands.add_parser("migrate", help="apply pending database migrations (safe to run concurrently)")

    token = commands.add_parser("token", help="manage API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="create a token and print it (only it) on stdout")
    create.add_argument("name", help="the principal: the client service this token belongs to")
    create.add_argument("--queue", action="append", default=[], help="a queue it may use (repeatable)")
    create.add_argument("--admin", action="store_true", help="may manage queues and use every queue")
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
        if args.command == "migrate":
            return _migrate(settings)
        if args.command == "token":
            return _token_create(settings, args.name, args.queue, args.admin)
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


def _serve(settings: Settings, host: str, port: int, threads: int) -> int:
    import waitress

    from api import create_app

    app = create_app(settings, configure_logs=False)
    waitress.serve(app, host=host, port=port, threads=threads, ident="tickler")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
