"""`tickler queues list | show | pause | resume`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tickler.commands.arguments import check_queue_name, command_actor
from tickler.commands.output import age, print_fields, print_json, print_table
from tickler.scheduler.errors import NotFound

if TYPE_CHECKING:  # the store (and SQLAlchemy) is imported when a subcommand runs, not to parse
    import psycopg

    from tickler.scheduler.store import QueueGauges, Store


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    queues = subparsers.add_parser("queues", help="list queues, show one, pause or resume one")
    actions = queues.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every queue with its counts, oldest due age and paused state")
    listing.add_argument("--json", action="store_true", help="JSON for scripts")
    for name, text in (
        ("show", "one queue's settings and counts"),
        ("pause", "pause a queue: nothing is claimed or delivered; scheduling goes on"),
        ("resume", "resume a paused queue"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("queue")
        action.add_argument("--json", action="store_true", help="JSON for scripts")


def run(store: Store, args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list(store)
    check_queue_name(args.queue)
    if args.action == "pause":
        store.queues.pause(args.queue, actor=command_actor())
    elif args.action == "resume":
        store.queues.resume(args.queue, actor=command_actor())
    return _show(store, args.queue, args.json)


def _list(store: Store) -> int:
    """`queues list --json`: each queue as the HTTP API shows it (the table: print_listing)."""
    gauges = {g.name: g for g in store.queues.gauges()}
    print_json({"queues": [_json(store, q.name, gauges.get(q.name)) for q in store.queues.list()]})
    return 0


def print_listing(conn: psycopg.Connection) -> int:
    """`queues list`: a table, read over one plain connection (scheduler/plain.py, no store)."""
    from tickler.scheduler.plain import queue_listing

    rows = []
    for q in queue_listing(conn):
        state = [q["name"], q["delivery_mode"], "paused" if q["paused"] else "active"]
        if q["due"] is None:  # created between the two reads
            rows.append([*state, *["-"] * 5])
            continue
        oldest = age(q["oldest_due_age_seconds"]) if q["due"] else "-"
        rows.append([*state, q["pending"], q["due"], q["in_flight"], q["dead"], oldest])
    print_table(["QUEUE", "MODE", "STATE", "PENDING", "DUE", "IN_FLIGHT", "DEAD", "OLDEST_DUE"], rows)
    return 0


def _json(store: Store, name: str, gauges: QueueGauges | None) -> dict[str, object]:
    from tickler.api.render import queue_json  # the HTTP API's shape; loaded only when JSON is asked for

    body = queue_json(store.queues.get(name), counts=store.queues.counts(name))
    if gauges is not None:
        body["oldest_due_age_seconds"] = gauges.oldest_due_age_seconds
    return body


def _upcoming(store: Store, name: str) -> str:
    """The forecast in one line: pending events falling due in the next 24 hours, hour by hour."""
    found = store.forecasts.forecast(name, hours=24, bucket="hour")
    soon = sum(b.count for b in found.buckets)
    hours = " ".join(str(b.count) for b in found.buckets)
    estimate = "" if found.exact else " (estimate)"
    return f"{soon} pending falling due (by hour: {hours}); {found.later} later{estimate}"


def _show(store: Store, name: str, as_json: bool) -> int:
    found = store.queues.gauges([name])
    if not found:
        raise NotFound(f"No queue named {name!r}.")
    gauges = found[0]
    if as_json:
        print_json(_json(store, name, gauges))
        return 0
    queue = store.queues.get(name)
    counts = store.queues.counts(name)
    delivery = queue.delivery_mode
    if queue.delivery_mode == "webhook":
        delivery += f" {queue.webhook_url} (timeout {queue.webhook_timeout_seconds:g} s)"
    print_fields(
        [
            ("queue", queue.name),
            ("state", "paused" if queue.paused else "active"),
            ("delivery", delivery),
            ("lease", f"{queue.lease_seconds:g} s"),
            ("max attempts", queue.max_attempts),
            (
                "backoff",
                f"{queue.backoff_initial_seconds:g} s x{queue.backoff_multiplier:g}, at most "
                f"{queue.backoff_max_seconds:g} s",
            ),
            *((status, n) for status, n in counts.items()),
            ("oldest due", age(gauges.oldest_due_age_seconds) if gauges.due else "-"),
            ("next 24 h", _upcoming(store, name)),
            ("created", queue.created_on),
            ("updated", queue.updated_on),
        ]
    )
    return 0
