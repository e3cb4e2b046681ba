"""Schemas of the operations API (SPEC §7): retry dead events, delete a queue."""

from __future__ import annotations

from marshmallow import Schema, fields

from tickler.api.schemas.fields import MatchingSchema, StrictFlag, WhenSchema


class RetrySchema(WhenSchema):
    """POST /v1/queues/{queue}/events/{item_key}/retry: when the retried event is due (default: now)."""


class RetryMatchingSchema(MatchingSchema):
    """POST /v1/queues/{queue}/events/retry: which dead events to retry (at least one filter)."""


class RetriedCountSchema(Schema):
    retried = fields.Integer(required=True)


class NoFieldsSchema(Schema):
    """The body of a call that takes none (pause, resume): empty, or an empty JSON object."""


class DeleteQueueArgsSchema(Schema):
    """Query string of DELETE /v1/queues/{queue}."""

    cancel_open = StrictFlag(
        load_default=False,
        metadata={"description": "Cancel the queue's open events (reason `queue deleted`) instead of refusing (409)."},
    )


class DeletedQueueSchema(Schema):
    name = fields.String(required=True)
    cancelled = fields.Integer(required=True, metadata={"description": "Open events cancelled by this delete."})
    deleted_events = fields.Integer(required=True, metadata={"description": "Events removed with the queue."})
