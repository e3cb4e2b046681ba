"""`tickler erase`: erase a subject (SPEC §12) from the command line, as POST /v1/erasures does.

The erasure is logged pending and the dispatcher runs it; `--wait` runs it here as well (the two
take turns batch by batch) and returns when it is done, so it works with no dispatcher running."""

from __future__ import annotations

import argparse
import getpass
import sys
import time
from typing import TYPE_CHECKING, Any

from tickler.commands.arguments import checked, key
from tickler.commands.output import print_json
from tickler.scheduler import rules

if TYPE_CHECKING:  # the parser is built for every command: the store is imported when run
    from tickler.scheduler.store import Store
    from tickler.scheduler.store.erasures import Erasure


def _reason_problem(value: str) -> str | None:
    return rules.check_text(value, 1000) if value.strip() else "Give a reason (not empty, not only spaces)."


_item_key = checked(rules.check_item_key)
_reason = checked(_reason_problem)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    erase = subparsers.add_parser(
        "erase", help="erase a subject: every event of a group, keys or a key prefix, and their timelines"
    )
    what = erase.add_argument_group("what to erase (at least one)")
    what.add_argument("--group-key", type=key, help="every event of this group")
    what.add_argument("--item-key", type=_item_key, action="append", dest="item_keys", help="this key (repeatable)")
    what.add_argument("--item-key-prefix", type=key, help="every key that starts with this (3 characters or more)")
    erase.add_argument("--queue", action="append", dest="queues", help="only in this queue (repeatable; default: all)")
    erase.add_argument("--reason", type=_reason, required=True, help="why (kept in the erasure log)")
    erase.add_argument("--actor", default=f"cli:{getpass.getuser()}", help="who the log names (cli:<user>)")
    erase.add_argument("--wait", action="store_true", help="run the erasure here and return once it is done")
    erase.add_argument("--json", action="store_true", help="JSON for scripts")


def run(store: Store, args: argparse.Namespace, secret: str) -> int:
    from tickler.scheduler import erasing
    from tickler.scheduler.store.erasures import ErasureStore, Selector

    if args.group_key is None and args.item_keys is None and args.item_key_prefix is None:
        print("tickler erase: give --group-key, --item-key and/or --item-key-prefix", file=sys.stderr)
        return 2
    selector = Selector(
        group_key=args.group_key,
        item_keys=None if args.item_keys is None else tuple(dict.fromkeys(args.item_keys)),
        item_key_prefix=args.item_key_prefix,
        queues=None if args.queues is None else tuple(args.queues),
    )
    erasure = erasing.request(store.engine, selector, reason=args.reason, requested_by=args.actor, secret=secret)
    if args.wait:
        eraser = erasing.Eraser(store.engine, erasing.Hasher(store.engine, secret))
        # False: writers held the closing lock, or a lease it took away has not expired yet; again soon
        while not eraser.run_or_fail(erasure.id):
            time.sleep(1.0)
        found = ErasureStore(store.engine).get(erasure.id)
        assert found is not None
        erasure = found
    if args.json:
        print_json(_json(erasure))
    elif args.wait:
        print(
            f"{erasure.id} {erasure.status}: {erasure.open_events} open events, {erasure.finished_events} "
            f"finished events, {erasure.timeline_entries} timeline entries"
        )
    else:
        print(erasure.id)
    return 0 if erasure.status != "failed" else 1


def _json(erasure: Erasure) -> dict[str, Any]:
    from tickler.api.erasures import erasure_json  # the HTTP API's shape; loaded only when JSON is asked for

    # started_at and queues are not part of the command's answer: scripts may compare it whole.
    body = erasure_json(erasure)
    del body["started_at"], body["queues"]
    return body
