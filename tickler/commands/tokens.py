"""`tickler token create | list | revoke`: API tokens, straight in the store."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING

from tickler.commands.arguments import command_actor
from tickler.commands.output import print_json, print_table
from tickler.config import Settings
from tickler.scheduler.rules import check_queue_name

if TYPE_CHECKING:  # the store (and SQLAlchemy) is imported when a subcommand runs, not to parse
    from tickler.scheduler.store import Store


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = subparsers.add_parser("token", help="manage API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="create a token and print it (only it) on stdout")
    create.add_argument("name", help="the principal: the client service this token belongs to")
    create.add_argument("--queue", action="append", default=[], help="a queue it may use (repeatable)")
    create.add_argument("--admin", action="store_true", help="may manage queues and use every queue")
    listing = token_commands.add_parser("list", help="list tokens (ids, names, scopes; never the tokens)")
    listing.add_argument("--json", action="store_true", help="print JSON, for scripts")
    revoke = token_commands.add_parser("revoke", help="revoke a token by its id (see `tickler token list`)")
    revoke.add_argument("id", type=int)


@contextmanager
def _store(settings: Settings) -> Iterator[Store]:
    """The store over the existing, migrated database: a token command creates nothing, so that
    it runs as the service's role, which needs no DDL privilege (docs/deploy.md)."""
    from tickler.commands.database import open_store

    store, close = open_store(settings)
    try:
        yield store
    finally:
        close()


def run(settings: Settings, args: argparse.Namespace) -> int:
    """0 done; 1 refused (no such token, already revoked); 2 bad input."""
    command: Callable[[Settings, argparse.Namespace], int] = {"create": _create, "list": _list, "revoke": _revoke}[
        args.token_command
    ]
    return command(settings, args)


def _create(settings: Settings, args: argparse.Namespace) -> int:
    bad = [q for q in args.queue if check_queue_name(q)]
    if bad:
        print(f"tickler: not a queue name: {bad[0]!r}", file=sys.stderr)
        return 2
    if not 1 <= len(args.name) <= 200:
        print("tickler: the name must be 1-200 characters", file=sys.stderr)
        return 2
    with _store(settings) as store:
        known = {queue.name for queue in store.queues.list(sorted(set(args.queue)))}
        for name in sorted(set(args.queue) - known):
            # Allowed (the queue may be created after its token), but said: a typo would
            # otherwise give a token that answers 404 on every call.
            print(
                f"tickler: warning: no queue named {name!r} yet; the token will reach it once created", file=sys.stderr
            )
        print(store.tokens.create(args.name, queues=args.queue, is_admin=args.admin, actor=command_actor()))
    return 0


def _list(settings: Settings, args: argparse.Namespace) -> int:
    """Over one plain connection (scheduler/plain.py): no store, no SQLAlchemy, quick to start."""
    from tickler.commands.database import open_reader
    from tickler.scheduler.plain import fetch

    with open_reader(settings) as conn:
        tokens = [SimpleNamespace(**row) for row in fetch(conn, "list_tokens", {})]
    if args.json:
        print_json(
            [
                {
                    "id": info.id,
                    "name": info.principal,
                    "admin": info.is_admin,
                    "queues": list(info.queues),
                    "created_on": info.created_on.isoformat().replace("+00:00", "Z"),
                    "revoked_on": info.revoked_on.isoformat().replace("+00:00", "Z") if info.revoked_on else None,
                    # as the API's last_used_at: updated at most once a minute per process
                    "last_used_at": info.last_used_on.isoformat().replace("+00:00", "Z") if info.last_used_on else None,
                }
                for info in tokens
            ]
        )
        return 0
    rows = [
        (
            info.id,
            info.principal,
            "admin" if info.is_admin else ",".join(info.queues) or "(no queues)",
            info.created_on,
            f"{info.last_used_on:%Y-%m-%d %H:%M}" if info.last_used_on else "never",
            f"revoked {info.revoked_on:%Y-%m-%d %H:%M:%S}" if info.revoked_on else "active",
        )
        for info in tokens
    ]
    print_table(("ID", "NAME", "SCOPE", "CREATED", "LAST USED", "STATE"), rows)
    return 0


def _revoke(settings: Settings, args: argparse.Namespace) -> int:
    with _store(settings) as store:
        before = next((info for info in store.tokens.list() if info.id == args.id), None)
        if before is None:
            print(f"tickler: no token {args.id}", file=sys.stderr)
            return 1
        if before.revoked_on is not None:
            print(
                f"tickler: token {before.id} of {before.principal} was already revoked on "
                f"{before.revoked_on:%Y-%m-%d %H:%M:%S} UTC",
                file=sys.stderr,
            )
            return 1
        info = store.tokens.revoke(args.id, actor=command_actor())
    assert info is not None
    print(f"revoked token {info.id} of {info.principal}")
    return 0
