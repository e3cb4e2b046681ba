"""Schemas of the pull-consumer calls: /v1/queues/{queue}/claims and lease ack / nack / extend."""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from tickler.api.schemas.fields import StrictBoolean, StrictInteger, StrictNumber, Text, name_field

MAX_WAIT_SECONDS = 20.0


class ClaimSchema(Schema):
    """POST /v1/queues/{queue}/claims."""

    worker = name_field(100, "The consumer's name; claimed_by is principal/worker.")
    limit = StrictInteger(load_default=1, validate=validate.Range(min=1, max=1000))
    lease_seconds = StrictNumber(validate=validate.Range(min=0.1, max=86_400))
    wait_seconds = StrictNumber(
        load_default=0.0,
        validate=validate.Range(min=0, max=MAX_WAIT_SECONDS),
        metadata={"description": "Long-poll this long for due events when none is due."},
    )


class AckManySchema(Schema):
    """POST /v1/leases/ack."""

    lease_ids = fields.List(
        fields.UUID(),
        required=True,
        validate=validate.Length(min=1, max=1000),
        metadata={"description": "Leases to finish as delivered (each answers delivered or stale)."},
    )


class AckManyResultSchema(Schema):
    results = fields.List(fields.Dict())


class NackSchema(Schema):
    """POST /v1/leases/{lease_id}/nack."""

    error = Text(required=True, max_length=2000)
    retry_in_seconds = StrictNumber(validate=validate.Range(min=0, max=366 * 86_400))
    dead = StrictBoolean(load_default=False)


class ExtendSchema(Schema):
    """POST /v1/leases/{lease_id}/extend."""

    seconds = StrictNumber(required=True, validate=validate.Range(min=0.1, max=86_400))


class LeaseSchema(Schema):
    lease_id = fields.String()
    expires_at = fields.String()
    group_key = fields.String(allow_none=True)
    events = fields.List(fields.Dict())


class ClaimResultSchema(Schema):
    leases = fields.List(fields.Nested(LeaseSchema))


class AckResultSchema(Schema):
    lease_id = fields.String()
    status = fields.String(metadata={"enum": ["delivered"]})


class NackResultSchema(Schema):
    lease_id = fields.String()
    status = fields.String(metadata={"enum": ["retrying", "dead"]})
    dead = fields.Integer(metadata={"description": "How many events of the lease are now dead."})
    retrying = fields.Integer(metadata={"description": "How many events of the lease will be retried."})
    retry_at = fields.String(allow_none=True, metadata={"description": "When the retried events are due."})


class ExtendResultSchema(Schema):
    lease_id = fields.String()
    expires_at = fields.String()
