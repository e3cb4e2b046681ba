"""Schemas of /v1/erasures (admin, SPEC §12): request an erasure, an erasure as the log shows it,
and the look-up of a value."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates, validates_schema

from tickler.api import patterns
from tickler.api.schemas.fields import Key, RuledString, Text
from tickler.scheduler import rules
from tickler.scheduler.erasing import MIN_PREFIX_LENGTH
from tickler.scheduler.rules import check_queue_name

MAX_ITEM_KEYS = 1000


class RequestErasureSchema(Schema):
    """POST /v1/erasures: what to erase (at least one of group_key, item_keys, item_key_prefix;
    events matching any of them), where (default: every queue) and why."""

    group_key = Key(metadata={"description": "Erase every event of this group, open or finished."})
    item_keys = fields.List(
        RuledString(rules.item_key, metadata=patterns.item_key_metadata()),
        validate=validate.Length(min=1, max=MAX_ITEM_KEYS, error="Give 1 to {max} keys."),
        metadata={"description": "Erase every event of these keys, and their timelines."},
    )
    item_key_prefix = Key(
        validate=validate.Length(min=MIN_PREFIX_LENGTH, error="A prefix has at least {min} characters."),
        metadata={
            "description": "Erase every event whose key starts with this, and their timelines.",
            "minLength": MIN_PREFIX_LENGTH,
        },
    )
    queues = fields.List(
        fields.String(metadata=patterns.queue_name_metadata()),
        validate=validate.Length(min=1, max=1000, error="Give 1 to {max} queues, or leave queues out (every queue)."),
    )
    reason = Text(
        required=True,
        max_length=1000,
        validate=validate.Regexp(r".*\S", error="Give a reason (not empty, not only spaces)."),
        metadata={"description": "Why (kept in the erasure log; never put the erased values here)."},
    )

    @validates("queues")
    def _queue_names(self, value: list[str], **kwargs: Any) -> None:
        bad = [name for name in value if check_queue_name(name)]
        if bad:
            raise ValidationError(f"Not a queue name: {bad[0]!r}.")

    @validates_schema
    def _selector(self, data: dict[str, Any], **kwargs: Any) -> None:
        if not {"group_key", "item_keys", "item_key_prefix"} & data.keys():
            message = "Give group_key, item_keys and/or item_key_prefix."
            raise ValidationError({"group_key": [message], "item_keys": [message], "item_key_prefix": [message]})


class ErasureLookupArgsSchema(Schema):
    """GET /v1/erasures: the value to look up, by its keyed hash (exactly one of the two)."""

    item_key = RuledString(rules.item_key, metadata=patterns.item_key_metadata())
    group_key = Key()

    @validates_schema
    def _one(self, data: dict[str, Any], **kwargs: Any) -> None:
        if len({"item_key", "group_key"} & data.keys()) != 1:
            message = "Give item_key or group_key (one of them)."
            raise ValidationError({"item_key": [message], "group_key": [message]})


class ErasureCountsSchema(Schema):
    open_events = fields.Integer(metadata={"description": "Open events cancelled (reason `erased`)."})
    finished_events = fields.Integer(metadata={"description": "Finished events whose values were replaced."})
    timeline_entries = fields.Integer(metadata={"description": "Timeline entries whose key and details were replaced."})
    archive_rows = fields.Integer(metadata={"description": "Rows of the Parquet archive rewritten (see `note`)."})


class ErasureSchema(Schema):
    id = fields.Integer()
    status = fields.String(validate=validate.OneOf(["pending", "running", "done", "failed"]))
    requested_by = fields.String()
    requested_at = fields.String()
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)
    reason = fields.String()
    queues = fields.List(fields.String(), allow_none=True, metadata={"description": "null: every queue."})
    counts = fields.Nested(ErasureCountsSchema)
    note = fields.String(allow_none=True)


class ErasureListSchema(Schema):
    erasures = fields.List(fields.Nested(ErasureSchema))
