"""Schemas of /v1/tokens (admin): issue a token, and a token as the answers show it."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates

from tickler.api import patterns
from tickler.api.schemas.fields import StrictBoolean, name_field
from tickler.scheduler.rules import check_queue_name


class IssueTokenSchema(Schema):
    """POST /v1/tokens."""

    name = name_field(200, "The principal: the client service the token belongs to.")
    queues = fields.List(
        fields.String(metadata=patterns.queue_name_metadata()), load_default=list, validate=validate.Length(max=1000)
    )
    admin = StrictBoolean(load_default=False)

    @validates("queues")
    def _queues(self, value: list[str], **kwargs: Any) -> None:
        bad = [name for name in value if check_queue_name(name)]
        if bad:
            raise ValidationError(f"Not a queue name: {bad[0]!r}.")


class TokenSchema(Schema):
    id = fields.Integer()
    name = fields.String()
    admin = fields.Boolean()
    queues = fields.List(fields.String())
    created_on = fields.String()
    revoked_on = fields.String(allow_none=True)
    last_used_at = fields.String(
        allow_none=True,
        metadata={"description": "When it was last used, to the minute (written at most once a minute); null: never."},
    )
    token = fields.String(metadata={"description": "Only in the answer to POST: the one time it is shown."})
