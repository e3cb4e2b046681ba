"""/v1/queues: create and configure queues (admin), list them, read their settings and counts."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api import context
from api.render import queue_json
from api.schemas import PutQueueSchema
from scheduler.errors import NotFound
from scheduler.rules import check_queue_name
from scheduler.store import QueueSettings

bp = Blueprint("queues", __name__, url_prefix="/queues")

_put_schema = PutQueueSchema()


@bp.put("/<queue>")
def put_queue(queue: str) -> Response:
    context.require_admin()
    problem = check_queue_name(queue)
    if problem:
        raise NotFound(f"{queue!r} cannot name a queue. {problem}")
    fields = _put_schema.load(context.json_body())
    delivery = fields.get("delivery", {})
    backoff = fields.get("backoff", {})
    wanted = QueueSettings(
        delivery_mode=delivery.get("mode"),
        webhook_url=delivery.get("url"),
        webhook_timeout_seconds=delivery.get("timeout_seconds"),
        lease_seconds=fields.get("lease_seconds"),
        max_attempts=fields.get("max_attempts"),
        backoff_initial_seconds=backoff.get("initial_seconds"),
        backoff_max_seconds=backoff.get("max_seconds"),
        backoff_multiplier=backoff.get("multiplier"),
        rotate_signing_secret=fields.get("rotate_signing_secret", False),
    )
    ext = context.tickler()
    result = ext.store.queues.put(queue, wanted, ext.settings)
    ext.queues.forget(queue)
    response = jsonify(queue_json(result.queue, signing_secret=result.new_signing_secret))
    response.status_code = 201 if result.created else 200
    return response


@bp.get("")
def list_queues() -> Response:
    caller = context.principal()
    names = None if caller.is_admin else sorted(caller.queues)
    queues = context.store().queues.list(names)
    return jsonify({"queues": [queue_json(q) for q in queues]})


@bp.get("/<queue>")
def get_queue(queue: str) -> Response:
    found = context.visible_queue(queue)
    counts = context.store().queues.counts(queue)
    return jsonify(queue_json(found, counts=counts))
