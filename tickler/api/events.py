"""/v1/queues/{queue}/events: schedule, read, change, cancel, search and trace events by key."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Response, current_app, jsonify, request
from marshmallow import Schema
from werkzeug.routing import BaseConverter

from tickler.api import auth, context
from tickler.api.jsonio import optional_orjson
from tickler.api.metrics import EVENTS_SCHEDULED
from tickler.api.render import etag, event_json, timeline_json
from tickler.api.schemas.events import (
    RISKY_ESCAPE,
    BatchSchema,
    CancelArgsSchema,
    CancelMatchingSchema,
    ChangeEventSchema,
    ScheduleEventSchema,
    SearchArgsSchema,
    data_is_certainly_storable,
)
from tickler.scheduler import rules, tracing
from tickler.scheduler.errors import InFlight, Invalid, KeyConflict, TooLarge
from tickler.scheduler.models import NewEvent
from tickler.scheduler.states import ALL_STATUSES, Scheduled
from tickler.scheduler.store import EventChanges, Matching, SearchFilter
from tickler.scheduler.store.events import UNSET
from tickler.scheduler.store.search import decode_cursor, sort_order
from tickler.scheduler.tracing import TraceContext

bp = Blueprint("events", __name__, url_prefix="/queues/<queue>/events")


class ItemKeyConverter(BaseConverter):
    """A key in /events/<item_key>, but not `batch`, `cancel` or another endpoint beside it: those
    answer 405 with `Allow: POST` to other methods, instead of acting as keys."""

    regex = r"(?!(?:{})\Z)[^/]+".format("|".join(rules.ENDPOINT_SEGMENTS))


_schedule_schema = ScheduleEventSchema()
_batch_schemas: dict[int, BatchSchema] = {}
_change_schema = ChangeEventSchema()
_cancel_args_schema = CancelArgsSchema()
_cancel_matching_schema = CancelMatchingSchema()


def _check_data(data: dict[str, Any], field: str) -> None:
    """413 for data over the size limit, 400 for data jsonb cannot store."""
    problem = rules.check_data(data, context.tickler().settings.max_event_data_bytes)
    if problem is None:
        return
    kind, message = problem
    if kind == "too_large":
        raise TooLarge(message, errors={field: [message]})
    raise Invalid("The request is not valid.", errors={field: [message]})


_orjson = optional_orjson()


def _items_certainly_storable(raw_body: bytes, events: list[NewEvent], max_event_data_bytes: int) -> list[bool]:
    """Per event, True when its data certainly passes the data rules, for a body over the size
    limit (a batch of 10,000): no risky escape in the body, and orjson's compact text of the data at
    most half the limit (orjson and json write the same text but for a float's exponent, a few
    bytes). Without orjson, or for any other event: False (the exact check decides)."""
    if _orjson is None or RISKY_ESCAPE.search(raw_body) is not None:
        return [False] * len(events)
    half = max_event_data_bytes // 2
    fits = []
    for event in events:
        try:
            fits.append(len(_orjson.dumps(event.data)) <= half)
        except TypeError:  # an integer beyond 64 bits: the exact check
            fits.append(False)
    return fits


def _take_item_traces(body: Any) -> list[TraceContext | None]:
    """Take each batch item's own `traceparent`/`tracestate` out of it (SPEC §11), before the item
    is checked: [] when no item has one. A malformed one is ignored, never refused."""
    events = body.get("events") if isinstance(body, dict) else None
    if type(events) is not list:
        return []
    traces: list[TraceContext | None] = []
    found = False
    for item in events:
        if type(item) is dict and ("traceparent" in item or "tracestate" in item):
            found = True
            traces.append(TraceContext.parse(item.pop("traceparent", None), item.pop("tracestate", None)))
        else:
            traces.append(None)
    return traces if found else []


def _if_match() -> set[int] | None:
    """The versions If-Match accepts (None: any). A tag that is no version of ours matches nothing."""
    # A header that is present but parses to nothing (`If-Match: ,`) still asks for a match.
    if "If-Match" not in request.headers or request.if_match.star_tag:
        return None
    versions = set()
    for tag in request.if_match.as_set():
        # werkzeug parses `""` as the tag None; isdigit() alone is also true of "²", which int() refuses
        if tag is not None and tag.isascii() and tag.isdigit():
            versions.add(int(tag))
    return versions


def _event_response(event: Any, status: int = 200, **extra: Any) -> Response:
    response = jsonify(event_json(event, **extra))
    response.status_code = status
    response.headers["ETag"] = etag(event)
    return response


# A key in a path segment as url_for writes it (werkzeug's BaseConverter.to_url).
_SEGMENT_SAFE = "!$&'()*+,/:;=@"


@bp.post("")
def schedule(queue: str) -> Response:
    # Counted from before the body is read: a group commit waits only for requests on their way.
    with context.store().events.groups.handling():
        return _schedule(queue)


def _schedule(queue: str) -> Response:
    target = auth.visible_queue(queue)
    body = context.json_body()
    event, on_conflict, debounce_max = _schedule_schema.load_event(body)
    ext = context.tickler()
    if not data_is_certainly_storable(request.get_data(cache=True), ext.settings.max_event_data_bytes):
        _check_data(event.data, "data")
    incoming = TraceContext.from_headers(request.headers)  # malformed: None (ignored, never refused)
    with tracing.span("create", queue, parent=incoming, tickler__item_key=event.item_key) as span:
        try:
            found, outcome = ext.store.events.schedule(
                target,
                event,
                actor=auth.principal().name,
                on_conflict=on_conflict,
                debounce_max_seconds=debounce_max,
                # traced here: the event keeps this span's context; else the caller's, as sent
                trace=span.context or incoming,
            )
        except (KeyConflict, InFlight) as conflict:
            # Counted like a rejected item of a batch; the error handler answers 409.
            EVENTS_SCHEDULED.labels(queue, Scheduled.REJECTED).inc()
            span.fail(str(conflict), type(conflict).__name__)
            raise
        span.set(messaging__message__id=str(found.id), tickler__outcome=outcome)
    EVENTS_SCHEDULED.labels(queue, outcome).inc()
    # What jsonify and url_for("v1.events.get_event", ...) write, without their lookups.
    text = current_app.json.dumps(event_json(found, outcome=outcome), separators=(",", ":")) + "\n"
    response = current_app.response_class(
        text, status=202 if outcome == Scheduled.CREATED else 200, mimetype="application/json"
    )
    response.headers["ETag"] = etag(found)
    quoted = quote(found.item_key, safe=_SEGMENT_SAFE)
    response.headers["Location"] = f"{request.script_root}/v1/queues/{queue}/events/{quoted}"
    return response


@bp.post("/batch")
def schedule_batch(queue: str) -> Response:
    target = auth.visible_queue(queue)
    settings = context.tickler().settings
    body = context.json_body()
    item_traces = _take_item_traces(body)
    schema = _batch_schemas.get(settings.max_batch_events)
    if schema is None:
        schema = _batch_schemas[settings.max_batch_events] = BatchSchema(max_events=settings.max_batch_events)
    events, on_conflict, debounce_max = schema.load_events(body)
    raw = request.get_data(cache=True)
    if not data_is_certainly_storable(raw, settings.max_event_data_bytes):
        fits = _items_certainly_storable(raw, events, settings.max_event_data_bytes)
        for index, event in enumerate(events):
            if not fits[index]:
                _check_data(event.data, f"events[{index}].data")
    incoming = TraceContext.from_headers(request.headers)
    with tracing.span(
        "create", queue, parent=incoming, links=item_traces, messaging__batch__message_count=len(events)
    ) as span:
        # An item's own traceparent wins; the others take the request's (this span's, when traced).
        request_trace = span.context or incoming
        traces = [item_traces[i] or request_trace for i in range(len(events))] if item_traces else None
        if traces is None and request_trace is not None:
            traces = [request_trace] * len(events)
        results = context.store().events.schedule_batch(
            target,
            events,
            actor=auth.principal().name,
            on_conflict=on_conflict,
            debounce_max_seconds=debounce_max,
            traces=traces,
        )
        counts: dict[str, int] = {}
        for result in results:
            counts[result.outcome] = counts.get(result.outcome, 0) + 1
        answer = jsonify({"results": [{"item_key": r.item_key, "outcome": r.outcome, "id": r.id} for r in results]})
    for outcome, n in counts.items():
        EVENTS_SCHEDULED.labels(queue, outcome).inc(n)
    return answer


@bp.post("/cancel")
def cancel_matching(queue: str) -> Response:
    return on_matching(queue, _cancel_matching_schema, context.store().events.cancel_matching, "cancelled")


def on_matching(queue: str, schema: Schema, act: Callable[..., int], answer: str) -> Response:
    """A call on the events a filter matches: `act` gets the filter (group_key and/or
    item_key_prefix), the caller and the other fields given; the answer is how many it touched."""
    auth.visible_queue(queue)
    fields = schema.load(context.json_body())
    matching = Matching(fields.pop("group_key", None), fields.pop("item_key_prefix", None))
    return jsonify({answer: act(queue, matching, actor=auth.principal().name, **fields)})


@bp.get("")
def search(queue: str) -> Response:
    auth.visible_queue(queue)
    settings = context.tickler().settings
    args = SearchArgsSchema(max_limit=settings.max_page_size).load(context.query_args())
    where = search_filter(
        args,
        limit=args["limit"] + 1,  # one more tells whether there is a next page
        after=decode_cursor(args["cursor"]) if "cursor" in args else None,
    )
    events = context.store().events.search(queue, where)
    page, more = events[: args["limit"]], len(events) > args["limit"]
    next_cursor = where.cursor_after(page[-1]) if more else None
    return jsonify({"events": [event_json(e) for e in page], "next_cursor": next_cursor})


def search_filter(args: dict[str, Any], *, limit: int, after: tuple[datetime, int] | None = None) -> SearchFilter:
    """The store's search filter of a search's loaded query string (SearchFiltersSchema)."""
    return SearchFilter(
        statuses=frozenset(args["status"].split(",")) if "status" in args else ALL_STATUSES,
        group_key=args.get("group_key"),
        item_key_prefix=args.get("item_key_prefix"),
        priority=args.get("priority"),
        fairness_key=args.get("fairness_key"),
        due_from=args.get("due_from"),
        due_until=args.get("due_until"),
        **sort_order(args.get("sort", "due")),
        limit=limit,
        after=after,
    )


@bp.get("/<item_key:item_key>")
def get_event(queue: str, item_key: str) -> Response:
    auth.visible_queue(queue)
    return _event_response(context.store().events.get(queue, item_key))


@bp.patch("/<item_key:item_key>")
def change_event(queue: str, item_key: str) -> Response:
    auth.visible_queue(queue)
    fields = _change_schema.load(context.json_body())
    if "data" in fields:
        _check_data(fields["data"], "data")
    changes = EventChanges(
        schedule_on=fields.get("schedule_on"),
        delay_seconds=fields.get("delay_seconds"),
        data=fields.get("data", UNSET),
        group_key=fields.get("group_key", UNSET),
        priority=fields.get("priority", UNSET),
        fairness_key=fields.get("fairness_key", UNSET),
    )
    event = context.store().events.change(queue, item_key, changes, actor=auth.principal().name, if_match=_if_match())
    return _event_response(event)


@bp.delete("/<item_key:item_key>")
@context.takes_query_args
def cancel_event(queue: str, item_key: str) -> Response:
    auth.visible_queue(queue)
    args = _cancel_args_schema.load(context.query_args())
    event = context.store().events.cancel(
        queue, item_key, actor=auth.principal().name, reason=args.get("reason"), if_match=_if_match()
    )
    return _event_response(event)


@bp.get("/<item_key>/timeline")
def timeline(queue: str, item_key: str) -> Response:
    auth.history_of_queue(queue)
    events = context.store().events
    entries = events.timeline(queue, item_key)
    return jsonify(timeline_json(item_key, entries, events.archived(queue, item_key)))
