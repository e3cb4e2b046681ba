"""Request and response schemas of /v1/queues/{queue}/schedules (they also generate /openapi.json)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import available_timezones

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from tickler.api import patterns
from tickler.api.schemas.fields import RFC3339, Key, RuledInteger, RuledString, StrictBoolean, bounds
from tickler.scheduler import cron, recurring, rules

# An occurrence's key is {schedule_key}@2026-11-23T08:00:00Z: 21 characters more, still an item_key.
MAX_SCHEDULE_KEY_LENGTH = rules.MAX_KEY_LENGTH - len("@2026-11-23T08:00:00Z")


def check_schedule_key(value: str) -> str | None:
    """A schedule_key follows the item_key rules, contains no '@', and leaves room for the time."""
    problem = rules.check_item_key(value)
    if problem:
        return problem
    if "@" in value:
        return "Must not contain '@' (it separates the key from the time in each occurrence's item_key)."
    if len(value) > MAX_SCHEDULE_KEY_LENGTH:
        return f"Must be at most {MAX_SCHEDULE_KEY_LENGTH} characters (occurrence keys add 21)."
    return None


class PutScheduleSchema(Schema):
    """PUT /v1/queues/{queue}/schedules/{schedule_key}."""

    cron = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=200), validate.Regexp(patterns.CRON_PATTERN)],
        metadata={
            "description": "Five fields: minute hour day-of-month month day-of-week (0 or 7 = Sunday).",
            "pattern": patterns.CRON_PATTERN,
        },
    )
    # The names the server knows, listed in /openapi.json (an `x-` keyword, not `enum`: six hundred
    # values as an enum make a fuzzer try each, for minutes, and say nothing a client needs).
    timezone = fields.String(
        required=True,
        validate=validate.Length(min=1, max=100),
        metadata={
            "description": "IANA time zone the cron expression is read in, e.g. Europe/Berlin or UTC "
            "(one of x-time-zones).",
            "x-time-zones": sorted(available_timezones()),
        },
    )
    data = fields.Dict(required=True, metadata={"description": "The payload of every occurrence (a JSON object)."})
    group_key = Key(allow_none=True, metadata={"description": "The group of every occurrence."})
    catch_up = fields.String(
        load_default="latest",
        validate=validate.OneOf(recurring.CATCH_UP_CHOICES),
        metadata={
            "description": "After downtime: latest = only the most recent missed occurrence, none, "
            f"all = every missed occurrence (at most {recurring.MAX_CATCH_UP}, the most recent)."
        },
    )
    paused = StrictBoolean(load_default=False, metadata={"description": "A paused schedule enqueues nothing."})
    priority = RuledInteger(
        rules.priority,
        load_default=0,
        metadata={
            "description": "The priority of every occurrence (SPEC §10).",
            **bounds(rules.MIN_PRIORITY, rules.MAX_PRIORITY),
        },
    )
    fairness_key = RuledString(
        rules.fairness_key,
        allow_none=True,
        metadata={"description": "The fairness key of every occurrence.", **patterns.item_key_metadata()},
    )

    @validates_schema
    def _parses(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "timezone" not in data or "cron" not in data:
            return
        try:
            cron.parse_timezone(data["timezone"])
        except ValueError as error:
            raise ValidationError({"timezone": [str(error)]}) from None
        try:
            expression = cron.parse(data["cron"], data["timezone"])
        except ValueError as error:
            raise ValidationError({"cron": [str(error)]}) from None
        if not expression.next(datetime.now(UTC), 1):
            raise ValidationError({"cron": ["Never fires (in the next 100 years)."]})


class ListSchedulesArgsSchema(Schema):
    """Query string of GET /v1/queues/{queue}/schedules."""

    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))
    # A schedule_key (the last of the previous page): checked by the key rule before the store
    # sees it, so that a NUL or a control character is a 400 naming the field.
    cursor = Key(metadata={"description": "next_cursor of the previous page (the last schedule_key it showed)."})


class ScheduleSchema(Schema):
    queue = fields.String()
    schedule_key = fields.String()
    cron = fields.String()
    timezone = fields.String()
    data = fields.Dict()
    group_key = fields.String(allow_none=True)
    catch_up = fields.String()
    paused = fields.Boolean()
    priority = fields.Integer()
    fairness_key = fields.String(allow_none=True)
    next_occurrences = fields.List(
        RFC3339(), metadata={"description": "The next 5 occurrences, UTC (none while paused)."}
    )
    last_enqueued = RFC3339(
        allow_none=True, metadata={"description": "The occurrence most recently enqueued (normally the waiting one)."}
    )
    created_on = RFC3339()
    created_by = fields.String()
    updated_on = RFC3339()
    updated_by = fields.String()
    version = fields.Integer()


class ScheduleListSchema(Schema):
    schedules = fields.List(fields.Nested(ScheduleSchema))
    next_cursor = fields.String(allow_none=True)
