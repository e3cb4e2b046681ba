"""/v1/queues: create and configure queues (admin), list them, read their settings and counts."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import structlog
from flask import Blueprint, Response, jsonify

from tickler.api import auth, context
from tickler.api.render import queue_json
from tickler.api.schemas.audit import ForecastArgsSchema
from tickler.api.schemas.queues import PutQueueSchema
from tickler.scheduler.errors import NotFound
from tickler.scheduler.rules import check_queue_name, format_timestamp
from tickler.scheduler.store import QueueSettings

bp = Blueprint("queues", __name__, url_prefix="/queues")

_put_schema = PutQueueSchema()
_forecast_args = ForecastArgsSchema()
audit = structlog.get_logger("tickler.audit")


@bp.put("/<queue>")
def put_queue(queue: str) -> Response:
    auth.require_admin()
    problem = check_queue_name(queue)
    if problem:
        raise NotFound(f"{queue!r} cannot name a queue. {problem}")
    wanted = wanted_settings(_put_schema.load(context.json_body()))
    ext = context.tickler()
    result = ext.store.queues.put(queue, wanted, ext.settings, actor=auth.principal().name)
    ext.queues.forget(queue)
    response = jsonify(queue_json(result.queue, signing_secret=result.new_signing_secret))
    response.status_code = 201 if result.created else 200
    return response


@bp.get("")
def list_queues() -> Response:
    caller = auth.principal()
    names = None if caller.is_admin else sorted(caller.queues)
    queues = context.store().queues.list(names)
    return jsonify({"queues": [queue_json(q) for q in queues]})


@bp.get("/<queue>")
def get_queue(queue: str) -> Response:
    found = auth.visible_queue(queue)
    counts = context.store().queues.counts(queue)
    return jsonify(queue_json(found, counts=counts))


@bp.get("/<queue>/forecast")
def forecast(queue: str) -> Response:
    """Upcoming load: the queue's pending events by when they fall due (store/forecast.py)."""
    auth.visible_queue(queue)
    args = _forecast_args.load(context.query_args())
    found = context.store().forecasts.forecast(queue, hours=args["hours"], bucket=args["bucket"])
    # 10,080 buckets at most (a week of minutes): their times by arithmetic on the epoch, not by
    # formatting that many datetimes
    first, step = int(found.start.timestamp()), int(found.width.total_seconds())
    buckets = [
        {"from": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first + i * step)), "count": n}
        for i, n in enumerate(found.counts)
    ]
    return jsonify({"buckets": buckets, "later": found.later, "exact": found.exact})


@bp.get("/<queue>/signing-secret")
def signing_secret(queue: str) -> Response:
    """A webhook queue's current signing secret (and the previous one while it still signs): for
    admins only, and every read is logged with who read it."""
    caller = auth.require_admin()
    if check_queue_name(queue) is not None:
        raise NotFound(f"No queue named {queue!r}.")
    found = context.store().queues.get(queue)
    if found.signing_secret is None:
        raise NotFound(f"{queue!r} is not a webhook queue: it has no signing secret.")
    audit.info("signing_secret_read", queue=queue, actor=caller.name)
    until = found.previous_secret_until
    previous = found.previous_signing_secret if until is not None and until > datetime.now(UTC) else None
    return jsonify(
        {
            "queue": queue,
            "signing_secret": found.signing_secret,
            "previous_signing_secret": previous,
            "previous_secret_until": format_timestamp(until) if previous else None,
        }
    )


def wanted_settings(fields: dict[str, Any]) -> QueueSettings:
    """The settings a loaded PUT body asks for (also what the dashboard's settings form sends)."""
    delivery = fields.get("delivery", {})
    backoff = fields.get("backoff", {})
    return QueueSettings(
        delivery_mode=delivery.get("mode"),
        webhook_url=delivery.get("url"),
        webhook_timeout_seconds=delivery.get("timeout_seconds"),
        lease_seconds=fields.get("lease_seconds"),
        max_attempts=fields.get("max_attempts"),
        backoff_initial_seconds=backoff.get("initial_seconds"),
        backoff_max_seconds=backoff.get("max_seconds"),
        backoff_multiplier=backoff.get("multiplier"),
        rotate_signing_secret=fields.get("rotate_signing_secret", False),
        max_in_flight=fields.get("max_in_flight"),
        rate_per_second=fields.get("rate_per_second"),
        retention_days=fields.get("retention_days"),
        archive_before_prune=fields.get("archive_before_prune"),
        fair_share=fields.get("fair_share"),
        max_in_flight_per_key=fields.get("max_in_flight_per_key"),
        cleared=frozenset(
            name
            for name in ("max_in_flight", "rate_per_second", "max_in_flight_per_key")
            if name in fields and fields[name] is None
        ),
    )
