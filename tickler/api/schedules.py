"""/v1/queues/{queue}/schedules: recurring schedules (SPEC §6), by key. Queue access as for events."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from marshmallow import ValidationError

from tickler.api import auth, context
from tickler.api.schemas.schedules import ListSchedulesArgsSchema, PutScheduleSchema, check_schedule_key
from tickler.scheduler import rules
from tickler.scheduler.errors import Invalid, NotFound, TooLarge
from tickler.scheduler.store.schedules import ScheduleSpec, schedule_to_json
from tickler.scheduler.tracing import TraceContext

bp = Blueprint("schedules", __name__, url_prefix="/queues/<queue>/schedules")

_put_schema = PutScheduleSchema()
_list_schema = ListSchedulesArgsSchema()


@bp.put("/<schedule_key>")
def put_schedule(queue: str, schedule_key: str) -> Response:
    auth.visible_queue(queue)
    problem = check_schedule_key(schedule_key)
    body = context.json_body()
    try:
        fields = _put_schema.load(body)
    except ValidationError as error:
        if not problem:
            raise
        # Name every mistake at once: the key's beside the body's.
        messages = dict(error.messages) if isinstance(error.messages, dict) else {"body": error.messages}
        raise ValidationError({**messages, "schedule_key": [problem]}) from None
    if problem:
        raise Invalid("The request is not valid.", errors={"schedule_key": [problem]})
    size = rules.check_data(fields["data"], context.tickler().settings.max_event_data_bytes)
    if size is not None:
        kind, message = size
        if kind == "too_large":
            raise TooLarge(message, errors={"data": [message]})
        raise Invalid("The request is not valid.", errors={"data": [message]})
    spec = ScheduleSpec(
        cron=fields["cron"],
        timezone=fields["timezone"],
        data=fields["data"],
        group_key=fields.get("group_key"),
        catch_up=fields["catch_up"],
        paused=fields["paused"],
        priority=fields["priority"],
        fairness_key=fields.get("fairness_key"),
    )
    schedule, created = context.store().schedules.put(
        queue,
        schedule_key,
        spec,
        actor=auth.principal().name,
        # kept as the schedule's last change: each occurrence's trace links to it (SPEC §11)
        trace=TraceContext.from_headers(request.headers),
    )
    response = jsonify(schedule_to_json(schedule))
    response.status_code = 201 if created else 200
    return response


@bp.get("")
def list_schedules(queue: str) -> Response:
    auth.visible_queue(queue)
    args = _list_schema.load(context.query_args())
    found = context.store().schedules.list(queue, after=args.get("cursor"), limit=args["limit"] + 1)
    page, more = found[: args["limit"]], len(found) > args["limit"]
    return jsonify(
        {"schedules": [schedule_to_json(s) for s in page], "next_cursor": page[-1].schedule_key if more else None}
    )


@bp.get("/<schedule_key>")
def get_schedule(queue: str, schedule_key: str) -> Response:
    auth.visible_queue(queue)
    if check_schedule_key(schedule_key):
        raise NotFound(f"No schedule with key {schedule_key!r} in queue {queue!r}.")
    return jsonify(schedule_to_json(context.store().schedules.get(queue, schedule_key)))


@bp.delete("/<schedule_key>")
def delete_schedule(queue: str, schedule_key: str) -> Response:
    auth.visible_queue(queue)
    if check_schedule_key(schedule_key):
        raise NotFound(f"No schedule with key {schedule_key!r} in queue {queue!r}.")
    schedule = context.store().schedules.delete(queue, schedule_key, actor=auth.principal().name)
    return jsonify(schedule_to_json(schedule))
