"""`tickler schedules list | show`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tickler.commands.arguments import check_queue_name, key
from tickler.commands.output import print_fields, print_json, print_table

if TYPE_CHECKING:  # the store (and SQLAlchemy) is imported when a subcommand runs, not to parse
    from tickler.scheduler.store import Store


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schedules = subparsers.add_parser("schedules", help="list a queue's recurring schedules, show one")
    actions = schedules.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="a queue's schedules with their next occurrence")
    listing.add_argument("queue")
    show = actions.add_parser("show", help="one schedule with its next five occurrences")
    show.add_argument("queue")
    show.add_argument("schedule_key", type=key)
    for action in (listing, show):
        action.add_argument("--json", action="store_true", help="JSON for scripts")


def run(store: Store, args: argparse.Namespace) -> int:
    from tickler.scheduler.store.schedules import schedule_to_json

    check_queue_name(args.queue)
    store.queues.get(args.queue)  # NotFound for a queue that does not exist
    if args.action == "show":
        schedule = store.schedules.get(args.queue, args.schedule_key)
        if args.json:
            print_json(schedule_to_json(schedule))
            return 0
        body = schedule_to_json(schedule)
        nexts = body.pop("next_occurrences")
        print_fields([*body.items(), ("next_occurrences", ", ".join(nexts) or None)])
        return 0
    found = store.schedules.list(args.queue)
    if args.json:
        print_json({"schedules": [schedule_to_json(s) for s in found]})
        return 0
    rows = [
        [
            s.schedule_key,
            s.cron,
            s.timezone,
            "paused" if s.paused else "active",
            s.catch_up,
            s.next_occurrences[0] if s.next_occurrences else None,
            s.last_enqueued,
        ]
        for s in found
    ]
    print_table(["SCHEDULE_KEY", "CRON", "TIMEZONE", "STATE", "CATCH_UP", "NEXT (UTC)", "LAST_ENQUEUED (UTC)"], rows)
    return 0
