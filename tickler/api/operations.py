"""Operations API (SPEC §7): retry dead events (queue access), pause, resume and delete queues (admin)."""

from __future__ import annotations

from typing import Any

import structlog
from flask import Blueprint, Response, jsonify, request

from tickler.api import auth, context
from tickler.api.events import on_matching
from tickler.api.render import etag, event_json, queue_json
from tickler.api.schemas.operations import DeleteQueueArgsSchema, NoFieldsSchema, RetryMatchingSchema, RetrySchema
from tickler.scheduler.errors import NotFound
from tickler.scheduler.rules import check_queue_name

log = structlog.get_logger("tickler.operations")

bp = Blueprint("operations", __name__, url_prefix="/queues/<queue>")

_retry_schema = RetrySchema()
_retry_matching_schema = RetryMatchingSchema()
_delete_args_schema = DeleteQueueArgsSchema()
_no_fields_schema = NoFieldsSchema()


def _optional_body() -> dict[str, Any]:
    """The JSON object of the body; an empty body means `{}` (a retry due now needs no body)."""
    if not request.get_data(cache=True).strip():
        return {}
    return context.json_body()


@bp.post("/events/<item_key>/retry")
def retry(queue: str, item_key: str) -> Response:
    auth.visible_queue(queue)
    fields = _retry_schema.load(_optional_body())
    event = context.store().events.retry(
        queue,
        item_key,
        actor=auth.principal().name,
        schedule_on=fields.get("schedule_on"),
        delay_seconds=fields.get("delay_seconds"),
    )
    response = jsonify(event_json(event))
    response.headers["ETag"] = etag(event)
    return response


@bp.post("/events/retry")
def retry_matching(queue: str) -> Response:
    return on_matching(queue, _retry_matching_schema, context.store().events.retry_matching, "retried")


def _admin_queue(queue: str) -> None:
    """An admin call on a queue name: 403 for non-admins, 404 for a name no queue can have."""
    auth.require_admin()
    problem = check_queue_name(queue)
    if problem:
        raise NotFound(f"{queue!r} cannot name a queue. {problem}")


def _set_paused(queue: str, paused: bool) -> Response:
    _admin_queue(queue)
    _no_fields_schema.load(_optional_body())  # a body with anything in it is a mistake: 400, nothing changed
    queues = context.store().queues
    actor = auth.principal().name
    changed = queues.pause(queue, actor=actor) if paused else queues.resume(queue, actor=actor)
    context.tickler().queues.forget(queue)
    log.info("queue_paused" if paused else "queue_resumed", queue=queue, actor=auth.principal().name)
    return jsonify(queue_json(changed, counts=queues.counts(queue)))


@bp.post("/pause")
def pause(queue: str) -> Response:
    return _set_paused(queue, True)


@bp.post("/resume")
def resume(queue: str) -> Response:
    return _set_paused(queue, False)


@bp.delete("")
@context.takes_query_args
def delete_queue(queue: str) -> Response:
    _admin_queue(queue)
    args = _delete_args_schema.load(context.query_args())
    deleted = context.store().queues.delete(queue, actor=auth.principal().name, cancel_open=args["cancel_open"])
    context.tickler().queues.forget(queue)
    log.info("queue_deleted", queue=queue, actor=auth.principal().name, cancelled=deleted.cancelled)
    return jsonify({"name": deleted.name, "cancelled": deleted.cancelled, "deleted_events": deleted.deleted_events})
