"""`tickler audit`: the operations log, newest first (who changed which queue or token, and how)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import TYPE_CHECKING

from tickler.commands.output import print_json, print_table
from tickler.scheduler.rules import format_timestamp, parse_rfc3339

if TYPE_CHECKING:  # the store (and SQLAlchemy) is imported when the subcommand runs, not to parse
    from tickler.scheduler.store import Store


def _since(value: str) -> datetime:
    try:
        return parse_rfc3339(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = subparsers.add_parser("audit", help="the operations log: changes to queues and tokens, admin sign-ins")
    audit.add_argument("--queue", help="entries of this queue")
    audit.add_argument("--actor", help="entries of this actor (a token's name, cli:<user>)")
    audit.add_argument("--action", help="entries of this action (queue.created, token.revoked, ...)")
    audit.add_argument("--since", type=_since, help="entries at or after this time (RFC 3339)")
    audit.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50)")
    audit.add_argument("--json", action="store_true", help="JSON for scripts")


def _changes(before: dict[str, object] | None, after: dict[str, object] | None) -> str:
    """What changed, for people: `field: old -> new`, or the values given."""
    if before is None and after is None:
        return ""
    if before is None or after is None:
        return ", ".join(f"{k}={v}" for k, v in (before or after or {}).items())
    return ", ".join(f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(set(before) | set(after)))


def run(store: Store, args: argparse.Namespace) -> int:
    from tickler.scheduler.store.audit import ACTIONS, EntryFilter

    if args.action is not None and args.action not in ACTIONS:
        print(f"tickler: --action must be one of {', '.join(ACTIONS)}", file=sys.stderr)
        return 2
    if not 1 <= args.limit <= 10_000:
        print("tickler: --limit must be from 1 to 10000", file=sys.stderr)
        return 2
    where = EntryFilter(queue=args.queue, actor=args.actor, action=args.action, since=args.since)
    entries = store.audit.page(where, limit=args.limit)
    if args.json:
        print_json(
            {
                "entries": [
                    {
                        "id": e.id,
                        "at": format_timestamp(e.at),
                        "actor": e.actor,
                        "action": e.action,
                        "queue": e.queue,
                        "before": e.before,
                        "after": e.after,
                    }
                    for e in entries
                ]
            }
        )
        return 0
    rows = [[e.at, e.actor, e.action, e.queue, _changes(e.before, e.after)] for e in entries]
    print_table(["AT", "ACTOR", "ACTION", "QUEUE", "CHANGES"], rows)
    return 0
