"""Schemas of /v1/queues/{queue}/events: schedule, change, cancel, search, timelines; and the
problem details every error answer carries."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, ClassVar, NoReturn

from marshmallow import Schema, ValidationError, fields, validate, validates, validates_schema

from tickler.api import patterns
from tickler.api.schemas.fields import (
    RFC3339,
    Key,
    MatchingSchema,
    RuledDict,
    RuledInteger,
    RuledNumber,
    RuledString,
    Text,
    WhenSchema,
    bounds,
)
from tickler.scheduler import rules
from tickler.scheduler.models import NewEvent
from tickler.scheduler.states import SEARCH_STATUSES, Scheduled, Status

# JSON escapes that could put a NUL or a lone surrogate into a string (jsonb refuses both).
RISKY_ESCAPE = re.compile(rb"\\u(0000|[dD][89a-fA-F])")


def data_is_certainly_storable(raw_body: bytes, max_event_data_bytes: int) -> bool:
    """True when no event's data can break a data rule: the whole body is within the per-event
    size limit, and it has no escape that could hold a NUL or a lone surrogate (then the exact
    check, which writes the data out again, is not needed)."""
    return len(raw_body) <= max_event_data_bytes and RISKY_ESCAPE.search(raw_body) is None


# What a schedule takes: its events, on_conflict and debounce_max_seconds (None: no cap).
Loaded = tuple[list[NewEvent], str, float | None]

# -- requests ---------------------------------------------------------------------------------------


class NewEventSchema(WhenSchema):
    """One event to schedule."""

    item_key = RuledString(
        rules.item_key,
        required=True,
        metadata={"description": "The natural key, chosen by the client.", **patterns.item_key_metadata()},
    )
    group_key = RuledString(
        rules.group_key,
        allow_none=True,
        metadata={"description": "Due events of one group are claimed together.", **patterns.key_metadata()},
    )
    data = RuledDict(rules.data, required=True, metadata={"description": "The event's payload (a JSON object)."})
    max_attempts = RuledInteger(rules.max_attempts, metadata=bounds(1, rules.MAX_ATTEMPTS_LIMIT))
    priority = RuledInteger(
        rules.priority,
        metadata={
            "description": "Higher first: among due events, claims take higher priority first, then earlier due time.",
            "default": 0,
            **bounds(rules.MIN_PRIORITY, rules.MAX_PRIORITY),
        },
    )
    fairness_key = RuledString(
        rules.fairness_key,
        allow_none=True,
        metadata={
            "description": "With the queue's fair_share on, due events of equal priority are handed out round "
            "robin across fairness keys (and max_in_flight_per_key caps each key's leases). The events of one "
            "group share one fairness key.",
            **patterns.item_key_metadata(),
        },
    )


class _OnConflict(Schema):
    """What scheduling does to a key that already has an open event (one event or a batch)."""

    on_conflict = RuledString(
        rules.on_conflict,
        load_default="reject",
        metadata={
            "enum": list(rules.SCHEDULE_ON_CONFLICT),
            "description": "When the key already has an open event: reject (409), ignore, replace, or debounce "
            "(latest wins, capped by debounce_max_seconds).",
        },
    )
    debounce_max_seconds = RuledNumber(
        rules.debounce_max_seconds,
        metadata={
            "description": 'With "on_conflict": "debounce": the event is due at the latest this many seconds after '
            "it was first enqueued, however often it is debounced. Omitted: no cap (the latest time always wins). "
            "No effect with another on_conflict.",
            **bounds(0, rules.MAX_DELAY_SECONDS),
        },
    )


def _refused(schema: Schema, body: Any, refusal: Exception) -> NoReturn:
    """A body the rules refuse: the schema loads it to name every error (its fields apply the same
    rules), and should it take the body all the same, the rules' own messages are the answer."""
    schema.load(body)
    errors = refusal.errors if isinstance(refusal, rules.RuleErrors) else {"body": [str(refusal)]}
    raise ValidationError(errors)  # type: ignore[arg-type]


def _on_conflict(body: dict[str, Any]) -> tuple[str, float | None]:
    on_conflict = rules.on_conflict(body["on_conflict"]) if "on_conflict" in body else "reject"
    if "debounce_max_seconds" not in body:
        return on_conflict, None
    return on_conflict, rules.debounce_max_seconds(body["debounce_max_seconds"])


_SCHEDULE_ONLY = frozenset({"on_conflict", "debounce_max_seconds"})
_BATCH_FIELDS = frozenset({"events", *_SCHEDULE_ONLY})


class ScheduleEventSchema(NewEventSchema, _OnConflict):
    """POST /v1/queues/{queue}/events."""

    def load_event(self, body: dict[str, Any]) -> tuple[NewEvent, str, float | None]:
        """(event, on_conflict, debounce_max_seconds), checked by scheduler.rules once (what each
        field of the schema applies, without marshmallow's cost); a body the rules refuse is
        loaded by the schema, which raises ValidationError naming every error."""
        try:
            on_conflict, debounce_max = _on_conflict(body)
            if not body.keys().isdisjoint(_SCHEDULE_ONLY):
                body = {k: v for k, v in body.items() if k not in _SCHEDULE_ONLY}
            return rules.new_event(body, datetime.now(UTC)), on_conflict, debounce_max
        except (rules.RuleError, rules.RuleErrors) as refusal:
            _refused(self, body, refusal)


class BatchSchema(_OnConflict):
    """POST /v1/queues/{queue}/events/batch."""

    events = fields.List(fields.Nested(NewEventSchema), required=True)

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

    def load_events(self, body: dict[str, Any]) -> Loaded:
        """(events, on_conflict, debounce_max_seconds), checked by scheduler.rules once, as
        ScheduleEventSchema.load_event does: loading 10,000 events through marshmallow costs more
        than storing them. A body the rules refuse: ValidationError naming every error."""
        try:
            return self._by_rules(body)
        except (rules.RuleError, rules.RuleErrors) as refusal:
            _refused(self, body, refusal)

    def _by_rules(self, body: dict[str, Any]) -> Loaded:
        unknown = body.keys() - _BATCH_FIELDS
        if unknown:
            raise rules.RuleErrors({name: [rules.UNKNOWN] for name in unknown})
        on_conflict, debounce_max = _on_conflict(body)
        items = body.get("events")
        if type(items) is not list or not 1 <= len(items) <= self.max_events:
            raise rules.RuleError(f"events: a list of 1 to {self.max_events} events.")
        now = datetime.now(UTC)
        events: list[NewEvent] = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            if type(item) is not dict:
                raise rules.RuleError(f"events[{index}]: not an object.")
            try:
                event = rules.new_event(item, now)
            except rules.RuleErrors as refusal:
                raise rules.RuleErrors({f"events[{index}].{k}": v for k, v in refusal.errors.items()}) from None
            if event.item_key in seen:
                raise rules.RuleError(f"events[{index}].item_key: also the key of an earlier event.")
            seen.add(event.item_key)
            events.append(event)
        return events, on_conflict, debounce_max


class ChangeEventSchema(WhenSchema):
    """PATCH /v1/queues/{queue}/events/{item_key}: any of these; the others keep their value."""

    openapi_extra: ClassVar[dict[str, Any]] = {**patterns.NOT_BOTH_WHEN, "minProperties": 1}

    data = RuledDict(rules.data)
    group_key = RuledString(rules.group_key, allow_none=True, metadata=patterns.key_metadata())
    priority = RuledInteger(rules.priority, metadata=bounds(rules.MIN_PRIORITY, rules.MAX_PRIORITY))
    fairness_key = RuledString(rules.fairness_key, allow_none=True, metadata=patterns.item_key_metadata())

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _something(self, data: dict[str, Any], original: Any, **kwargs: Any) -> None:
        if not original:
            raise ValidationError(
                "Give at least one of schedule_on, delay_seconds, data, group_key, priority, fairness_key."
            )


class CancelArgsSchema(Schema):
    """Query string of DELETE /v1/queues/{queue}/events/{item_key}."""

    reason = Text(max_length=1000)


class CancelMatchingSchema(MatchingSchema):
    """POST /v1/queues/{queue}/events/cancel."""

    reason = Text(max_length=1000)


# How a search orders its events: by due time or by last change (then id), earliest or latest first.
SORTS = ("due", "-due", "changed", "-changed")


class SearchFiltersSchema(Schema):
    """The filters and order of a search, shared by GET /v1/queues/{queue}/events and its export."""

    status = fields.String(
        metadata={
            "description": "One status or several, comma-separated; `due` = the pending events whose time has come.",
            "pattern": patterns.STATUSES_PATTERN,
        }
    )
    group_key = Key()
    item_key_prefix = Key()
    priority = fields.Integer(
        validate=validate.Range(min=rules.MIN_PRIORITY, max=rules.MAX_PRIORITY),
        metadata={"description": "Only events of this priority."},
    )
    fairness_key = Key(metadata={"description": "Only events of this fairness key."})
    due_from = RFC3339(metadata={"description": "Only events due at or after this time (RFC 3339 with offset)."})
    due_until = RFC3339(metadata={"description": "Only events due at or before this time (RFC 3339 with offset)."})
    sort = fields.String(
        load_default="due",
        validate=validate.OneOf(SORTS),
        metadata={
            "description": "`due`: earliest due time first (the default); `-due`: latest first; "
            "`changed` / `-changed`: by when each event last changed (`changed_on`), oldest / newest first."
        },
    )

    @validates("status")
    def _status(self, value: str, **kwargs: Any) -> None:
        unknown = [s for s in value.split(",") if s not in SEARCH_STATUSES]
        if unknown:
            raise ValidationError(f"Unknown status {unknown[0]!r}; one of {', '.join(sorted(SEARCH_STATUSES))}.")

    @validates_schema
    def _due_range(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "due_from" in data and "due_until" in data and data["due_from"] > data["due_until"]:
            raise ValidationError("Must not be before due_from.", "due_until")


class SearchArgsSchema(SearchFiltersSchema):
    """Query string of GET /v1/queues/{queue}/events."""

    limit = fields.Integer(load_default=100, validate=validate.Range(min=1))
    cursor = fields.String(
        validate=[validate.Length(min=1, max=2000), validate.Regexp(patterns.CURSOR_PATTERN)],
        metadata={
            "description": "next_cursor of the previous page (opaque: only one handed out is valid).",
            "pattern": patterns.CURSOR_PATTERN,
        },
    )

    def __init__(self, *, max_limit: int = 1000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_limit = max_limit

    @validates("limit")
    def _limit(self, value: int, **kwargs: Any) -> None:
        if value > self.max_limit:
            raise ValidationError(f"Must be at most {self.max_limit}.")


# The formats of an export: CSV (one row per event, `data` as JSON text) or JSON Lines.
EXPORT_FORMATS = ("csv", "jsonl")
# An export stops after this many events unless `limit` says otherwise (at most this).
MAX_EXPORT_EVENTS = 10_000_000


class ExportArgsSchema(SearchFiltersSchema):
    """Query string of GET /v1/queues/{queue}/export: a search's filters, every matching event."""

    format = fields.String(
        load_default="jsonl",
        validate=validate.OneOf(EXPORT_FORMATS),
        metadata={"description": "`jsonl` (JSON Lines, one event a line; the default) or `csv`."},
    )
    limit = fields.Integer(
        load_default=MAX_EXPORT_EVENTS,
        validate=validate.Range(min=1, max=MAX_EXPORT_EVENTS),
        metadata={"description": "Stop after this many events."},
    )


# -- answers ----------------------------------------------------------------------------------------


class EventSchema(Schema):
    """An event, as every response shows it."""

    id = fields.Integer()
    queue = fields.String()
    item_key = fields.String()
    group_key = fields.String(allow_none=True)
    schedule_on = RFC3339()
    data = fields.Dict()
    status = fields.String(metadata={"enum": [s.value for s in Status]})
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
    priority = fields.Integer()
    fairness_key = fields.String(allow_none=True)
    changed_on = RFC3339(
        metadata={"description": "When the event last changed (`version` went up); a finished event's finish."}
    )


class ScheduledEventSchema(EventSchema):
    """An event with what scheduling did to it."""

    outcome = fields.String(metadata={"enum": [s.value for s in Scheduled if s is not Scheduled.REJECTED]})


class EventPageSchema(Schema):
    events = fields.List(fields.Nested(EventSchema))
    next_cursor = fields.String(allow_none=True)


class BatchResultSchema(Schema):
    item_key = fields.String()
    outcome = fields.String(metadata={"enum": [s.value for s in Scheduled]})
    id = fields.Integer(allow_none=True)


class BatchResultsSchema(Schema):
    results = fields.List(fields.Nested(BatchResultSchema))


class CancelledCountSchema(Schema):
    cancelled = fields.Integer()


class TimelineEntrySchema(Schema):
    at = RFC3339()
    action = fields.String()
    actor = fields.String()
    event_id = fields.Integer(
        allow_none=True, metadata={"description": "null for a recurring schedule's own entries (schedule_*)."}
    )
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


class ProblemSchema(Schema):
    """RFC 9457 problem details."""

    type = fields.String()
    title = fields.String()
    status = fields.Integer()
    detail = fields.String()
    errors = fields.Dict(
        keys=fields.String(), values=fields.List(fields.String()), metadata={"description": "Messages by field."}
    )
    event = fields.Nested(EventSchema, metadata={"description": "The open event of the key, on a 409 key-conflict."})
    archived = fields.Dict(
        metadata={"description": "With type .../archived: where the key's archived history is (as in its timeline)."}
    )
    lease_status = fields.String(
        metadata={
            "description": "On a 409 stale-lease: `expired` (its time ran out and nobody claimed its events since) "
            "or `unknown` (finished, claimed again, or never a lease; an ack that already landed shows in the "
            "key's timeline as a `delivered` entry carrying this lease_id).",
            "enum": ["expired", "unknown"],
        }
    )
