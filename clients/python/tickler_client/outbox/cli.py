"""`tickler-outbox`: create the outbox's tables, or run a relay.

    tickler-outbox install --database-url postgresql:///service
    tickler-outbox relay --database-url postgresql:///service --tickler-url http://tickler:8080 --token ...

Each option can come from the environment instead: TICKLER_OUTBOX_DATABASE_URL, TICKLER_URL,
TICKLER_TOKEN (keep the token out of the command line, where `ps` shows it)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import psycopg

from tickler_client.client import Client
from tickler_client.outbox import install
from tickler_client.outbox.relay import Relay


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickler-outbox", description="tickler's transactional outbox")
    commands = parser.add_subparsers(dest="command", required=True)
    database = argparse.ArgumentParser(add_help=False)
    database.add_argument(
        "--database-url",
        default=os.environ.get("TICKLER_OUTBOX_DATABASE_URL"),
        help="the service's PostgreSQL, as libpq takes it (env TICKLER_OUTBOX_DATABASE_URL)",
    )
    commands.add_parser("install", parents=[database], help="create the outbox's tables (again: no change)")
    relay = commands.add_parser("relay", parents=[database], help="forward committed rows until SIGTERM/SIGINT")
    relay.add_argument("--tickler-url", default=os.environ.get("TICKLER_URL"), help="env TICKLER_URL")
    relay.add_argument("--token", default=os.environ.get("TICKLER_TOKEN"), help="env TICKLER_TOKEN")
    relay.add_argument("--batch-size", type=int, default=100, help="rows per round (default 100)")
    relay.add_argument("--poll-seconds", type=float, default=0.5, help="pause when empty (default 0.5)")
    relay.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url (or TICKLER_OUTBOX_DATABASE_URL) is required")
    if args.command == "install":
        with psycopg.connect(args.database_url) as conn:
            install(conn)
        print("tickler outbox: tables ready")
        return 0
    if not args.tickler_url or not args.token:
        parser.error("--tickler-url and --token (or TICKLER_URL and TICKLER_TOKEN) are required")
    if args.batch_size < 1:
        parser.error("--batch-size must be 1 or more")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with (
        Client(args.tickler_url, args.token) as client,
        Relay(args.database_url, client, batch_size=args.batch_size, poll_seconds=args.poll_seconds) as relay,
    ):
        stats = relay.run()
    logging.getLogger("tickler_client.outbox").info("relay stopped: %s", stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
