"""`tickler queues list | show | pause | resume`."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from tickler.commands.arguments import check_queue_name
from tickler.commands.output import age, print_fields, print_json, print_table
from tickler.scheduler.errors import Invalid, NotFound, TicklerError

if TYPE_CHECKING:  # the store (and SQLAlchemy) is imported when a subcommand runs, not to parse
    import psycopg

    from tickler.scheduler.store import QueueGauges, Store


# `queues create`'s options: each sets one field of the body the HTTP API's PUT /v1/queues/{queue}
# takes (a path into it), checked by the same schema. (option, path, type, help)
_CREATE_OPTIONS: tuple[tuple[str, tuple[str, ...], Any, str], ...] = (
    ("--mode", ("delivery", "mode"), str, "pull or webhook (default pull)"),
    ("--url", ("delivery", "url"), str, "a webhook queue's receiver"),
    ("--timeout-seconds", ("delivery", "timeout_seconds"), float, "a webhook request's timeout"),
    ("--lease-seconds", ("lease_seconds",), float, "how long a claim holds an event"),
    ("--max-attempts", ("max_attempts",), int, "deliveries before an event is dead"),
    ("--backoff-initial-seconds", ("backoff", "initial_seconds"), float, "the first retry's delay"),
    ("--backoff-max-seconds", ("backoff", "max_seconds"), float, "the longest retry delay"),
    ("--backoff-multiplier", ("backoff", "multiplier"), float, "each retry's delay times this"),
    ("--max-in-flight", ("max_in_flight",), int, "leases live at once, cluster-wide"),
    ("--rate-per-second", ("rate_per_second",), float, "events claimed per second, cluster-wide"),
    ("--retention-days", ("retention_days",), int, "days finished events are kept"),
    ("--max-in-flight-per-key", ("max_in_flight_per_key",), int, "leases live at once per fairness key"),
)
_CREATE_FLAGS = (
    ("--fair-share", "fair_share", "round robin across fairness keys"),
    ("--archive-before-prune", "archive_before_prune", "remove history only once archived"),
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    queues = subparsers.add_parser("queues", help="create, list, show, pause or resume queues")
    actions = queues.add_subparsers(dest="action", required=True)
    create = actions.add_parser(
        "create",
        help="create a queue with the settings the HTTP API takes (PUT /v1/queues/NAME)",
        description="Create a queue. The options set the fields of the HTTP API's queue body; --settings gives "
        "that body as JSON (options win over it). Omitted settings take the defaults (TICKLER_DEFAULT_*).",
    )
    create.add_argument("queue")
    create.add_argument("--settings", metavar="JSON", help='the API\'s body, e.g. \'{"delivery": {"mode": "pull"}}\'')
    for option, _, kind, text in _CREATE_OPTIONS:
        create.add_argument(option, type=kind, help=text)
    for option, _, text in _CREATE_FLAGS:
        create.add_argument(option, action="store_true", default=None, help=text)
    create.add_argument("--json", action="store_true", help="JSON for scripts (as the HTTP API answers)")
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
    if args.action == "create":
        return _create(store, args)
    if args.action == "pause":
        store.queues.pause(args.queue)
    elif args.action == "resume":
        store.queues.resume(args.queue)
    return _show(store, args.queue, args.json)


def _create_body(args: argparse.Namespace) -> dict[str, Any]:
    """The PUT body the arguments ask for: --settings, then each option given over it."""
    body: dict[str, Any] = {}
    if args.settings is not None:
        try:
            body = json.loads(args.settings)
        except ValueError as error:
            raise Invalid("--settings is not JSON.", errors={"settings": [str(error)]}) from None
        if not isinstance(body, dict):
            raise Invalid("--settings must be a JSON object.", errors={"settings": ["Not an object."]})
    options = [(option, path) for option, path, _, _ in _CREATE_OPTIONS]
    options += [(option, (name,)) for option, name, _ in _CREATE_FLAGS]
    for option, path in options:
        value = getattr(args, option.removeprefix("--").replace("-", "_"))
        if value is None:
            continue
        inner = body
        for part in path[:-1]:
            inner = inner.setdefault(part, {})
        inner[path[-1]] = value
    if ("url" in body.get("delivery", {})) and "mode" not in body["delivery"]:
        body["delivery"]["mode"] = "webhook"  # --url alone: a webhook queue
    return body


def _create(store: Store, args: argparse.Namespace) -> int:
    """`queues create`: checked by the HTTP API's schema, so the same settings and the same
    per-field messages; refused when the queue exists (changing one is the API's PUT)."""
    from marshmallow import ValidationError

    from tickler.api.queues import wanted_settings
    from tickler.api.render import queue_json
    from tickler.api.schemas.queues import PutQueueSchema
    from tickler.config import Settings

    try:
        fields = PutQueueSchema().load(_create_body(args))
    except ValidationError as error:
        raise Invalid(f"The settings of queue {args.queue!r} are not valid.", errors=_flat(error.messages)) from None
    if store.queues.gauges([args.queue]):
        raise TicklerError(f"A queue named {args.queue!r} exists already (PUT /v1/queues/NAME changes it).")
    # Settings.from_env() read already at start: the defaults a new queue takes (TICKLER_DEFAULT_*).
    result = store.queues.put(args.queue, wanted_settings(fields), Settings.from_env())
    if args.json:
        print_json(queue_json(result.queue, signing_secret=result.new_signing_secret))
        return 0
    _show(store, args.queue, False)
    if result.new_signing_secret:
        print(f"signing secret  {result.new_signing_secret}  (shown once; GET /v1/queues/NAME/signing-secret)")
    return 0


def _flat(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages as {"delivery.url": [...]}, the HTTP API's field names."""
    if isinstance(messages, list):
        return {prefix or "settings": [str(m) for m in messages]}
    flat: dict[str, list[str]] = {}
    for name, inner in messages.items():
        flat.update(_flat(inner, f"{prefix}.{name}" if prefix else str(name)))
    return flat


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
            ("created", queue.created_on),
            ("updated", queue.updated_on),
        ]
    )
    return 0
