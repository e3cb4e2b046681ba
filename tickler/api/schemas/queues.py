"""Schemas of /v1/queues: a queue's settings, its counts and its signing secret."""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from tickler.api import patterns
from tickler.api.schemas.fields import RFC3339, StrictBoolean, StrictInteger, StrictNumber
from tickler.scheduler import rules
from tickler.scheduler.states import Status


class DeliverySchema(Schema):
    # _webhook below: a webhook queue needs a url; a pull queue takes neither url nor timeout.
    openapi_extra: ClassVar[dict[str, Any]] = {
        "oneOf": [
            {
                "properties": {"mode": {"const": "pull"}},
                "not": {"anyOf": [{"required": ["url"]}, {"required": ["timeout_seconds"]}]},
            },
            {"properties": {"mode": {"const": "webhook"}}, "required": ["url"]},
        ]
    }

    mode = fields.String(required=True, validate=validate.OneOf(["pull", "webhook"]))
    url = fields.Url(
        schemes={"http", "https"},
        require_tld=False,
        validate=validate.Length(max=2000),
        metadata={"pattern": patterns.URL_PATTERN},
    )
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


def _lease_cap(description: str) -> StrictInteger:
    """A cap on live leases: a whole number from 1 to a million, or null for no cap."""
    return StrictInteger(
        allow_none=True, validate=validate.Range(min=1, max=1_000_000), metadata={"description": description}
    )


class PutQueueSchema(Schema):
    """PUT /v1/queues/{queue}: settings to create a queue with, or to change (omitted: kept)."""

    delivery = fields.Nested(DeliverySchema)
    lease_seconds = StrictNumber(validate=validate.Range(min=0.1, max=86_400))
    max_attempts = StrictInteger(validate=validate.Range(min=1, max=rules.MAX_ATTEMPTS_LIMIT))
    backoff = fields.Nested(BackoffSchema)
    rotate_signing_secret = StrictBoolean(
        metadata={"description": "Generate a new webhook signing secret (the old one signs beside it for 24 h)."}
    )
    max_in_flight = _lease_cap(
        "At most this many leases of the queue live at once, across every process (null: no cap). "
        "A new webhook queue gets 100 unless given."
    )
    rate_per_second = StrictNumber(
        allow_none=True,
        validate=validate.Range(min=0, min_inclusive=False, max=1_000_000),
        metadata={"description": "At most this many events claimed per second, across every process (null: no limit)."},
    )
    retention_days = StrictInteger(
        validate=validate.Range(min=1, max=3650),
        metadata={
            "description": "Finished events and timeline entries are kept this many days, then removed a whole "
            "day at a time (default 30)."
        },
    )
    archive_before_prune = StrictBoolean(
        metadata={"description": "Remove a day of history only once `tickler pipeline archive` has written it."}
    )
    fair_share = StrictBoolean(
        metadata={
            "description": "Hand out due events of equal priority round robin across their fairness keys "
            "(default false)."
        }
    )
    max_in_flight_per_key = _lease_cap(
        "At most this many leases per fairness key live at once, across every process (null: no cap). "
        "Events without a fairness key count as one key."
    )


# A queue's events by status, and `due`: the pending ones whose time has come.
QueueCountsSchema = Schema.from_dict(
    {"due": fields.Integer(), **{status.value: fields.Integer() for status in Status}}, name="QueueCountsSchema"
)


class QueueSchema(Schema):
    name = fields.String()
    delivery = fields.Dict()
    lease_seconds = fields.Float()
    max_attempts = fields.Integer()
    backoff = fields.Dict()
    max_in_flight = fields.Integer(allow_none=True)
    rate_per_second = fields.Float(allow_none=True)
    retention_days = fields.Integer()
    archive_before_prune = fields.Boolean()
    fair_share = fields.Boolean()
    max_in_flight_per_key = fields.Integer(allow_none=True)
    paused = fields.Boolean(metadata={"description": "A paused queue delivers nothing; scheduling goes on."})
    created_on = RFC3339()
    updated_on = RFC3339()
    counts = fields.Nested(QueueCountsSchema)
    signing_secret = fields.String(metadata={"description": "Shown once: when generated."})


class SigningSecretSchema(Schema):
    queue = fields.String()
    signing_secret = fields.String(metadata={"description": "Signs every delivery of the queue."})
    previous_signing_secret = fields.String(
        allow_none=True, metadata={"description": "Also signs, until previous_secret_until (after a rotation)."}
    )
    previous_secret_until = RFC3339(allow_none=True)


class QueueListSchema(Schema):
    queues = fields.List(fields.Nested(QueueSchema))
