"""`tickler queues | events | schedules | erase | audit`: look at and act on a tickler database from a shell.

Like `tickler token`, these talk to the store directly with the same settings as every other
command (TICKLER_DATABASE_URL, or the embedded PostgreSQL under TICKLER_DATA_DIR). Tables for
people, `--json` for scripts. cli.py adds these subcommands and hands their arguments here.
"""

from __future__ import annotations

import argparse
import sys

from tickler.config import Settings

# The subcommands' modules (and the store under them) are imported when they are needed, so that
# `tickler --version` and the one-line errors of commands/failures.py cost nothing.

NAMES = ("queues", "events", "schedules", "erase", "audit")


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tickler.commands import audit, erase, events, queues, schedules

    queues.add_parser(subparsers)
    events.add_parser(subparsers)
    schedules.add_parser(subparsers)
    erase.add_parser(subparsers)
    audit.add_parser(subparsers)


def plain(args: argparse.Namespace) -> bool:
    """Whether the subcommand only reads over one plain connection (scheduler/plain.py): no store,
    no SQLAlchemy, no logging set up; what a person runs most often, so it starts the quickest."""
    return (args.command == "queues" and args.action == "list" and not args.json) or (
        args.command == "token" and args.token_command == "list"
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    """Run one of NAMES; 0 done, 1 refused (no such key, conflict...), 2 no database or bad input."""
    from tickler.commands import audit, erase, events, queues, schedules
    from tickler.commands.database import NoDatabase, open_reader, open_store
    from tickler.scheduler.errors import Invalid, TicklerError

    if plain(args):
        try:
            # queue counts may lag: the replica's (TICKLER_READ_DATABASE_URL) while it is close enough
            conn = open_reader(settings, may_lag=args.command == "queues")
        except NoDatabase as error:
            print(f"tickler: {error}", file=sys.stderr)
            return 2
        with conn:
            return queues.print_listing(conn)
    try:
        store, close = open_store(settings)
    except NoDatabase as error:
        print(f"tickler: {error}", file=sys.stderr)
        return 2
    try:
        if args.command == "erase":
            return erase.run(store, args, settings.secret_key)
        handlers = {"queues": queues.run, "events": events.run, "schedules": schedules.run, "audit": audit.run}
        handler = handlers[args.command]
        return handler(store, args)
    except TicklerError as error:
        print(f"tickler: {error.detail}", file=sys.stderr)
        for field, messages in error.extra.get("errors", {}).items():
            print(f"  {field}: {'; '.join(messages)}", file=sys.stderr)
        # Input the rules reject is a usage mistake (2), like a bad option; a refusal of valid
        # input (no such key, a conflict) is 1.
        return 2 if isinstance(error, Invalid) else 1
    finally:
        close()
