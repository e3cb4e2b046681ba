"""Schemas of the operations log (GET /v1/audit) and of a queue's upcoming load (forecast)."""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from tickler.api.patterns import CURSOR_PATTERN, QUEUE_NAME_PATTERN, TEXT_PATTERN
from tickler.api.schemas.fields import RFC3339
from tickler.scheduler.store.audit import ACTIONS
from tickler.scheduler.store.forecast import BUCKETS, MAX_HOURS


class AuditArgsSchema(Schema):
    """Query string of GET /v1/audit: every filter optional."""

    queue = fields.String(
        validate=validate.Regexp(QUEUE_NAME_PATTERN, error="Not a queue name."),
        metadata={"description": "Entries of this queue."},
    )
    # Text a token's name may hold (no NUL or control characters).
    actor = fields.String(
        validate=[validate.Length(min=1, max=200), validate.Regexp(TEXT_PATTERN, error="Not a name.")],
        metadata={"description": "Entries of this actor (a token's name)."},
    )
    action = fields.String(validate=validate.OneOf(ACTIONS), metadata={"description": "Entries of this action."})
    since = RFC3339(metadata={"description": "Entries at or after this time (RFC 3339 with an offset)."})
    cursor = fields.String(
        validate=validate.Regexp(CURSOR_PATTERN),
        metadata={"description": "next_cursor of the previous page (opaque)."},
    )
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))


class AuditEntrySchema(Schema):
    id = fields.Integer(required=True)
    at = fields.String(required=True, metadata={"description": "When (RFC 3339, UTC)."})
    actor = fields.String(required=True, metadata={"description": "Who: a token's name, `cli:<user>`, or `system`."})
    action = fields.String(required=True, metadata={"enum": list(ACTIONS)})
    queue = fields.String(allow_none=True)
    before = fields.Dict(allow_none=True, metadata={"description": "What changed, as it was (never a secret)."})
    after = fields.Dict(allow_none=True, metadata={"description": "What changed, as it is (never a secret)."})


class AuditPageSchema(Schema):
    entries = fields.List(fields.Nested(AuditEntrySchema), required=True)
    next_cursor = fields.String(allow_none=True)


class ForecastArgsSchema(Schema):
    """Query string of GET /v1/queues/{queue}/forecast."""

    hours = fields.Integer(load_default=24, validate=validate.Range(min=1, max=MAX_HOURS))
    bucket = fields.String(load_default="hour", validate=validate.OneOf(tuple(BUCKETS)))


class ForecastBucketSchema(Schema):
    start = fields.String(required=True, data_key="from", metadata={"description": "Start of the bucket (UTC)."})
    count = fields.Integer(required=True)


class ForecastSchema(Schema):
    buckets = fields.List(fields.Nested(ForecastBucketSchema), required=True)
    later = fields.Integer(required=True, metadata={"description": "Pending events falling due after the window."})
    exact = fields.Boolean(required=True, metadata={"description": "False where the counts are an estimate."})
