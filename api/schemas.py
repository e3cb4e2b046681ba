"""Request and response schemas. The same classes validate requests and generate /openapi.json.

Every field check that is an event rule calls scheduler.rules, so the HTTP API, the Python API
and the bulk import refuse the same things with the same messages.
"""

from __future__ import annotations

import numbers
from datetime import UTC, datetime
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates, validates_schema

from scheduler import rules
from scheduler.store.search import ALL_STATUSES

STATUS_CHOICES = ("pending", "in_flight", "delivered", "cancelled", "dead")


# -- strict fields --------------------------------------------------------------------------------


class StrictInteger(fields.Integer):
    """A JSON integer: not a string, not a boolean, not 3.0."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValidationError("Must be an integer.")
        return int(value)


class StrictNumber(fields.Float):
    """A JSON number (integer or decimal): not a string, not a boolean."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValidationError("Must be a number.")
        return float(super()._deserialize(value, attr, data, **kwargs))


class StrictBoolean(fields.Boolean):
    """A JSON true or false, nothing that merely looks like one."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ValidationError("Must be true or false.")
        return value


class RFC3339(fields.DateTime):
    """An RFC 3339 date-time with an offset ("Z" or ±hh:mm); returned in UTC."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(format="iso", **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> datetime:
        if not isinstance(value, str):
            raise ValidationError("Must be a string holding an RFC 3339 date-time.")
        try:
            return rules.parse_rfc3339(value)
        except ValueError as error:
            raise ValidationError(str(error)) from None

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> str | None:
        return rules.format_timestamp(value)


class Key(fields.String):
    """An item_key or group_key."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        problem = rules.check_key(text)
        if problem:
            raise ValidationError(problem)
        return text


class Text(fields.String):
    """Free text without control characters, of bounded length."""

    def __init__(self, max_length: int = 1000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_length = max_length

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        problem = rules.check_text(text, self.max_length)
        if problem:
            raise ValidationError(problem)
        return text


def _delay_field() -> StrictNumber:
    return StrictNumber(
        validate=validate.Range(min=0, max=rules.MAX_DELAY_SECONDS),
        metadata={"description": "Deliver this many seconds from now (database clock)."},
    )


def _schedule_field() -> RFC3339:
    return RFC3339(metadata={"description": "Deliver at this time (RFC 3339 with an offset)."})


def _check_when(data: dict[str, Any]) -> None:
    if "schedule_on" in data and "delay_seconds" in data:
        message = "Give schedule_on or delay_seconds, not both."
        raise ValidationError({"schedule_on": [message], "delay_seconds": [message]})
    when = data.get("schedule_on")
    if when is not None:
        problem = rules.check_schedule_on(when, datetime.now(UTC))
        if problem:
            raise ValidationError({"schedule_on": [problem]})


# -- events ---------------------------------------------------------------------------------------


class NewEventSchema(Schema):
    """One event to schedule."""

    item_key = Key(required=True, metadata={"description": "The natural key, chosen by the client."})
    group_key = Key(allow_none=True, metadata={"description": "Due events of one group are claimed together."})
    schedule_on = _schedule_field()
    delay_seconds = _delay_field()
    data = fields.Dict(required=True, metadata={"description": "The event's payload (a JSON object)."})
    max_attempts = StrictInteger(validate=validate.Range(min=1, max=rules.MAX_ATTEMPTS_LIMIT))

    @validates_schema
    def _when(self, data: dict[str, Any], **kwargs: Any) -> None:
        _check_when(data)


class ScheduleEventSchema(NewEventSchema):
    """POST /v1/queues/{queue}/events."""

    on_conflict = fields.String(load_default="reject", validate=validate.OneOf(rules.ON_CONFLICT_CHOICES))


class BatchSchema(Schema):
    """POST /v1/queues/{queue}/events/batch."""

    events = fields.List(fields.Nested(NewEventSchema), required=True)
    on_conflict = fields.String(load_default="reject", validate=validate.OneOf(rules.ON_CONFLICT_CHOICES))

    def __init__(self, *, max_events: int = 10_000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_events = max_events

    @validates("events")
    def _events(self, value: list[dict[str, Any]], **kwargs: Any) -> None:
        if not value:
            raise ValidationError("Must hold at least one event.")
        if len(value) > self.max_events:
            raise ValidationError(f"At most {self.max_events} events per batch.")
        first_seen: dict[str, int] = {}
        duplicates: dict[int, dict[str, list[str]]] = {}
        for index, event in enumerate(value):
            # An item that failed its own validation may be absent here or lack its key.
            key = event.get("item_key") if isinstance(event, dict) else None
            if key is None:
                continue
            if key in first_seen:
                message = f"Also the key of events[{first_seen[key]}]; keys in a batch must differ."
                duplicates[index] = {"item_key": [message]}
            else:
                first_seen[key] = index
        if duplicates:
            raise ValidationError(duplicates)  # type: ignore[arg-type]


class ChangeEventSchema(Schema):
    """PATCH /v1/queues/{queue}/events/{item_key}: any of these; the others keep their value."""

    schedule_on = _schedule_field()
    delay_seconds = _delay_field()
    data = fields.Dict()
    group_key = Key(allow_none=True)

    @validates_schema
    def _something(self, data: dict[str, Any], **kwargs: Any) -> None:
        if not data:
            raise ValidationError("Give at least one of schedule_on, delay_seconds, data, group_key.")
        _check_when(data)


class CancelArgsSchema(Schema):
    """Query string of DELETE /v1/queues/{queue}/events/{item_key}."""

    reason = Text(max_length=1000)


class CancelMatchingSchema(Schema):
    """POST /v1/queues/{queue}/events/cancel."""

    group_key = Key()
    item_key_prefix = Key()
    reason = Text(max_length=1000)

    @validates_schema
    def _filter(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "group_key" not in data and "item_key_prefix" not in data:
            raise ValidationError("Give group_key and/or item_key_prefix.")


class SearchArgsSchema(Schema):
    """Query string of GET /v1/queues/{queue}/events."""

    status = fields.String(metadata={"description": "One status or several, comma-separated."})
    group_key = Key()
    item_key_prefix = Key()
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1))
    cursor = fields.String(validate=validate.Length(max=2000))

    def __init__(self, *, max_limit: int = 1000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_limit = max_limit

    @validates("status")
    def _status(self, value: str, **kwargs: Any) -> None:
        unknown = [s for s in value.split(",") if s not in ALL_STATUSES]
        if unknown:
            raise ValidationError(f"Unknown status {unknown[0]!r}; one of {', '.join(STATUS_CHOICES)}.")

    @validates("limit")
    def _limit(self, value: int, **kwargs: Any) -> None:
        if value > self.max_limit:
            raise ValidationError(f"Must be at most {self.max_limit}.")


class EventSchema(Schema):
    """An event, as every response shows it."""

    id = fields.Integer()
    queue = fields.String()
    item_key = fields.String()
    group_key = fields.String(allow_none=True)
    schedule_on = RFC3339()
    data = fields.Dict()
    status = fields.String(metadata={"enum": list(STATUS_CHOICES)})
    enqueued_on = RFC3339()
    enqueued_by = fields.String()
    dequeued_on = RFC3339(allow_none=True)
    dequeued_by = fields.String(allow_none=True)
    claimed_on = RFC3339(allow_none=True)
    claimed_by = fields.String(allow_none=True)
    redeliver_count = fields.Integer()
    max_attempts = fields.Integer()
    last_error = fields.String(allow_none=True)
    version = fields.Integer()


class ScheduledEventSchema(EventSchema):
    """An event with what scheduling did to it."""

    outcome = fields.String(metadata={"enum": ["created", "ignored", "replaced"]})


class EventPageSchema(Schema):
    events = fields.List(fields.Nested(EventSchema))
    next_cursor = fields.String(allow_none=True)


class BatchResultSchema(Schema):
    item_key = fields.String()
    outcome = fields.String(metadata={"enum": ["created", "ignored", "replaced", "rejected"]})
    id = fields.Integer(allow_none=True)


class BatchResultsSchema(Schema):
    results = fields.List(fields.Nested(BatchResultSchema))


class CancelledCountSchema(Schema):
    cancelled = fields.Integer()


class TimelineEntrySchema(Schema):
    at = RFC3339()
    action = fields.String()
    actor = fields.String()
    event_id = fields.Integer()
    schedule_on = RFC3339(allow_none=True)
    details = fields.Dict()


class TimelineSchema(Schema):
    item_key = fields.String()
    entries = fields.List(fields.Nested(TimelineEntrySchema))
    archived = fields.Dict(
        metadata={
            "description": "Present when older entries were archived: where (location, timeline), "
            "up to when (archived_through) and how many events (archived_events)."
        }
    )


# -- queues ---------------------------------------------------------------------------------------


class DeliverySchema(Schema):
    mode = fields.String(required=True, validate=validate.OneOf(["pull", "webhook"]))
    url = fields.Url(schemes={"http", "https"}, require_tld=False, validate=validate.Length(max=2000))
    timeout_seconds = StrictNumber(validate=validate.Range(min=0.1, max=600))

    @validates_schema
    def _webhook(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data["mode"] == "webhook" and "url" not in data:
            raise ValidationError({"url": ["A webhook queue needs a url."]})
        if data["mode"] == "pull" and ("url" in data or "timeout_seconds" in data):
            raise ValidationError({"mode": ["A pull queue has no url or timeout_seconds."]})


class BackoffSchema(Schema):
    initial_seconds = StrictNumber(validate=validate.Range(min=0, max=86_400))
    max_seconds = StrictNumber(validate=validate.Range(min=0, max=30 * 86_400))
    multiplier = StrictNumber(validate=validate.Range(min=1, max=100))


class PutQueueSchema(Schema):
    """PUT /v1/queues/{queue}: settings to create a queue with, or to change (omitted: kept)."""

    delivery = fields.Nested(DeliverySchema)
    lease_seconds = StrictNumber(validate=validate.Range(min=0.1, max=86_400))
    max_attempts = StrictInteger(validate=validate.Range(min=1, max=rules.MAX_ATTEMPTS_LIMIT))
    backoff = fields.Nested(BackoffSchema)
    rotate_signing_secret = StrictBoolean(
        metadata={"description": "Generate a new webhook signing secret (the old one signs beside it for 24 h)."}
    )


class QueueCountsSchema(Schema):
    pending = fields.Integer()
    due = fields.Integer()
    in_flight = fields.Integer()
    delivered = fields.Integer()
    cancelled = fields.Integer()
    dead = fields.Integer()


class QueueSchema(Schema):
    name = fields.String()
    delivery = fields.Dict()
    lease_seconds = fields.Float()
    max_attempts = fields.Integer()
    backoff = fields.Dict()
    created_on = RFC3339()
    updated_on = RFC3339()
    counts = fields.Nested(QueueCountsSchema)
    signing_secret = fields.String(metadata={"description": "Shown once: when generated."})


class QueueListSchema(Schema):
    queues = fields.List(fields.Nested(QueueSchema))


class ProblemSchema(Schema):
    """RFC 9457 problem details."""

    type = fields.String()
    title = fields.String()
    status = fields.Integer()
    detail = fields.String()
    errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))
