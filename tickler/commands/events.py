"""`tickler events list | show | timeline | retry | cancel`."""

from __future__ import annotations

import argparse
import getpass
from typing import TYPE_CHECKING, Any

from tickler.commands.arguments import check_queue_name, key
from tickler.commands.output import print_fields, print_json, print_table
from tickler.scheduler import rules
from tickler.scheduler.errors import Invalid
from tickler.scheduler.models import Event, TimelineEntry
from tickler.scheduler.rules import event_to_json
from tickler.scheduler.states import ALL_STATUSES, SEARCH_STATUSES

if TYPE_CHECKING:  # the store (and SQLAlchemy) is imported when a subcommand runs, not to parse
    from tickler.scheduler.store import Store


def _time(value: str) -> Any:
    try:
        return rules.parse_rfc3339(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 <= seconds <= rules.MAX_DELAY_SECONDS:
        raise argparse.ArgumentTypeError(f"must be between 0 and {rules.MAX_DELAY_SECONDS:g}")
    return seconds


def _limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 1000")
    return int(value)


def _priority(value: str) -> int:
    try:
        return rules.priority(int(value))
    except (ValueError, rules.RuleError) as error:
        raise argparse.ArgumentTypeError(f"a priority is an integer from -100 to 100 ({error})") from None


def _statuses(value: str) -> frozenset[str]:
    wanted = frozenset(value.split(","))
    unknown = sorted(wanted - SEARCH_STATUSES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown status {unknown[0]!r}; one of {', '.join(sorted(SEARCH_STATUSES))}")
    return wanted


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    events = subparsers.add_parser("events", help="search events, show one and its timeline, retry or cancel")
    actions = events.add_subparsers(dest="action", required=True)

    listing = actions.add_parser("list", help="a page of a queue's events, by due time or last change")
    listing.add_argument("queue")
    listing.add_argument(
        "--status", type=_statuses, help="one status or a comma list (default: all); due = pending and due by now"
    )
    listing.add_argument("--group", type=key, help="only this group_key")
    listing.add_argument("--prefix", type=key, help="only item_keys starting with this")
    listing.add_argument("--priority", type=_priority, help="only this priority (-100..100)")
    listing.add_argument("--fairness-key", type=key, help="only this fairness_key")
    listing.add_argument("--due-from", type=_time, help="only events due at or after this RFC 3339 time")
    listing.add_argument("--due-until", type=_time, help="only events due at or before this RFC 3339 time")
    listing.add_argument(
        "--sort",
        choices=("due", "-due", "changed", "-changed"),
        default="due",
        help="due: earliest due first (default); --sort=-due: latest first; "
        "changed / --sort=-changed: by last change, oldest / newest first",
    )
    listing.add_argument("--limit", type=_limit, default=50, help="events per page, 1..1000 (default 50)")
    listing.add_argument("--cursor", help="the next page (printed after a full page)")

    for name, text in (("show", "the open event of a key, else its most recent one"), ("timeline", "a key's history")):
        action = actions.add_parser(name, help=text)
        action.add_argument("queue")
        action.add_argument("item_key", type=key)

    retry = actions.add_parser("retry", help="retry a dead event (by key) or every dead event matching a filter")
    retry.add_argument("queue")
    retry.add_argument("item_key", type=key, nargs="?")
    when = retry.add_mutually_exclusive_group()
    when.add_argument("--at", type=_time, help="due at this RFC 3339 time (default: now)")
    when.add_argument("--delay", type=_seconds, help="due this many seconds from now")

    cancel = actions.add_parser("cancel", help="cancel the open event of a key, or every one matching a filter")
    cancel.add_argument("queue")
    cancel.add_argument("item_key", type=key, nargs="?")
    cancel.add_argument("--reason", help="recorded in the timeline")

    for action in (retry, cancel):
        action.add_argument("--group", type=key, help="every matching event of this group_key (instead of a key)")
        action.add_argument("--prefix", type=key, help="every matching event whose item_key starts with this")
        action.add_argument("--actor", default=f"cli:{getpass.getuser()}", help="who the timeline names (cli:<user>)")
    for action in actions.choices.values():
        action.add_argument("--json", action="store_true", help="JSON for scripts")


def run(store: Store, args: argparse.Namespace) -> int:
    check_queue_name(args.queue)
    store.queues.get(args.queue)  # NotFound for a queue that does not exist
    if args.action == "list":
        return _list(store, args)
    if args.action == "show":
        _print_event(store.events.get(args.queue, args.item_key), args.json)
        return 0
    if args.action == "timeline":
        return _timeline(store, args)
    return _change(store, args)


def _list(store: Store, args: argparse.Namespace) -> int:
    from tickler.scheduler.store import SearchFilter
    from tickler.scheduler.store.search import decode_cursor, sort_order

    where = SearchFilter(
        statuses=args.status or ALL_STATUSES,
        group_key=args.group,
        item_key_prefix=args.prefix,
        priority=args.priority,
        fairness_key=args.fairness_key,
        due_from=args.due_from,
        due_until=args.due_until,
        **sort_order(args.sort),
        limit=args.limit + 1,
        after=decode_cursor(args.cursor) if args.cursor else None,
    )
    events = store.events.search(args.queue, where)
    page, more = events[: args.limit], len(events) > args.limit
    cursor = where.cursor_after(page[-1]) if more else None
    if args.json:
        print_json({"events": [event_to_json(e) for e in page], "next_cursor": cursor})
        return 0
    rows = [
        [
            e.id,
            e.item_key,
            e.group_key,
            e.priority,
            e.status,
            e.schedule_on,
            e.changed_on,
            f"{e.redeliver_count}/{e.max_attempts}",
            e.last_error,
        ]
        for e in page
    ]
    headers = [
        "ID",
        "ITEM_KEY",
        "GROUP",
        "PRIORITY",
        "STATUS",
        "SCHEDULE_ON (UTC)",
        "CHANGED_ON (UTC)",
        "REDELIVERIES/MAX",
        "LAST_ERROR",
    ]
    print_table(headers, rows)
    if cursor:
        print(f"more: --cursor {cursor}")
    return 0


def _print_event(event: Event, as_json: bool) -> None:
    if as_json:
        print_json(event_to_json(event))
        return
    body = event_to_json(event)
    print_fields([(name, value) for name, value in body.items()])


def timeline_json(item_key: str, entries: list[TimelineEntry], archived: dict[str, Any] | None) -> dict[str, Any]:
    """The timeline as GET .../timeline answers it (without importing the HTTP layer: it is slow to load)."""
    body: dict[str, Any] = {
        "item_key": item_key,
        "entries": [
            {
                "at": rules.format_timestamp(e.at),
                "action": e.action,
                "actor": e.actor,
                "event_id": e.event_id,
                "schedule_on": rules.format_timestamp(e.schedule_on),
                "details": e.details,
            }
            for e in entries
        ],
    }
    if archived is not None:
        body["archived"] = archived
    return body


def _timeline(store: Store, args: argparse.Namespace) -> int:
    entries = store.events.timeline(args.queue, args.item_key)
    archived = store.events.archived(args.queue, args.item_key)
    if args.json:
        print_json(timeline_json(args.item_key, entries, archived))
        return 0
    rows = [[e.at, e.action, e.actor, e.event_id, e.schedule_on, e.details or None] for e in entries]
    print_table(["AT (UTC)", "ACTION", "ACTOR", "EVENT", "SCHEDULE_ON (UTC)", "DETAILS"], rows)
    if archived:
        print(f"older entries archived: {archived}")
    return 0


def _change(store: Store, args: argparse.Namespace) -> int:
    from tickler.scheduler.store import Matching

    """retry / cancel: one key, or every match of --group / --prefix."""
    by_filter = args.group is not None or args.prefix is not None
    if by_filter == (args.item_key is not None):
        raise Invalid("Give an item_key, or --group and/or --prefix.", errors={"item_key": ["Key or filter."]})
    if args.action == "retry":
        if by_filter:
            if args.at or args.delay is not None:
                raise Invalid("--at and --delay apply to one key.", errors={"at": ["Only with an item_key."]})
            n = store.events.retry_matching(args.queue, Matching(args.group, args.prefix), actor=args.actor)
            return _count("retried", n, args.json)
        event = store.events.retry(
            args.queue, args.item_key, actor=args.actor, schedule_on=args.at, delay_seconds=args.delay
        )
    else:
        if by_filter:
            n = store.events.cancel_matching(
                args.queue, Matching(args.group, args.prefix), actor=args.actor, reason=args.reason
            )
            return _count("cancelled", n, args.json)
        event = store.events.cancel(args.queue, args.item_key, actor=args.actor, reason=args.reason)
    _print_event(event, args.json)
    return 0


def _count(what: str, n: int, as_json: bool) -> int:
    if as_json:
        print_json({what: n})
    else:
        print(f"{what} {n}")
    return 0
