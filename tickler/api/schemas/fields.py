"""The fields every resource's schemas share, and the groups of fields several requests take.

Every field check that is an event rule calls scheduler.rules, so the HTTP API, the Python API
and the bulk import refuse the same things with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from marshmallow import Schema, ValidationError, fields, missing, validate, validates_schema

from tickler.api import patterns
from tickler.scheduler import rules

# -- fields that apply scheduler.rules --------------------------------------------------------------


class _Ruled(fields.Field):  # type: ignore[type-arg]
    """Loads a value with a rule of scheduler.rules (which decides and words the message)."""

    def __init__(self, rule: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rule = rule

    def deserialize(self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any) -> Any:
        if value is missing or (value is None and self.allow_none):  # marshmallow's business
            return super().deserialize(value, attr, data, **kwargs)
        try:
            output = self.rule(value)
        except rules.RuleError as error:
            raise ValidationError(str(error)) from None
        if output is not None:
            self._validate(output)  # a field's own extra bounds (queue settings, lease times)
        return output


class RuledString(_Ruled, fields.String):
    pass


class RuledNumber(_Ruled, fields.Float):
    pass


class RuledInteger(_Ruled, fields.Integer):
    pass


class RuledDict(_Ruled, fields.Dict):
    pass


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


class RuledTime(_Ruled, RFC3339):
    pass


# -- strict JSON types ------------------------------------------------------------------------------


class StrictInteger(RuledInteger):
    """A JSON integer: not a string, not a boolean, not 3.0."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(rules.integer, **kwargs)


class StrictNumber(RuledNumber):
    """A JSON number (integer or decimal): not a string, not a boolean."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(rules.number, **kwargs)


class StrictBoolean(fields.Boolean):
    """A JSON true or false, nothing that merely looks like one."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ValidationError("Must be true or false.")
        return value


class StrictFlag(fields.Boolean):
    """A query-string flag: exactly `true` or `false`."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if value not in ("true", "false"):
            raise ValidationError("Must be true or false.")
        return bool(value == "true")


# -- keys and text ----------------------------------------------------------------------------------


def _documented(kwargs: dict[str, Any], rule: dict[str, object]) -> dict[str, Any]:
    """`kwargs` with the rule's JSON Schema keywords added to the field's metadata (/openapi.json)."""
    return {**kwargs, "metadata": {**rule, **kwargs.get("metadata", {})}}


class Key(RuledString):
    """A group_key, or a key prefix in a filter."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(rules.key, **_documented(kwargs, patterns.key_metadata()))


class Text(fields.String):
    """Free text without control characters, of bounded length."""

    def __init__(self, max_length: int = 1000, **kwargs: Any) -> None:
        super().__init__(**_documented(kwargs, patterns.text_metadata(max_length)))
        self.max_length = max_length

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        problem = rules.check_text(text, self.max_length)
        if problem:
            raise ValidationError(problem)
        return text


def name_field(max_length: int, description: str) -> Text:
    """A required name: text of 1 to `max_length` characters (a consumer, a token's principal)."""
    return Text(
        required=True, max_length=max_length, validate=validate.Length(min=1), metadata={"description": description}
    )


def bounds(low: float, high: float) -> dict[str, float]:
    """The JSON Schema keywords of a rule's range (the rule itself checks it)."""
    return {"minimum": low, "maximum": high}


# -- groups of fields several requests take ---------------------------------------------------------


class WhenSchema(Schema):
    """When an event is due: at a time or after a delay, not both (neither: the caller's default)."""

    openapi_extra: ClassVar[dict[str, Any]] = patterns.NOT_BOTH_WHEN

    schedule_on = RuledTime(
        rules.schedule_on,
        metadata={
            "description": "Deliver at this time (RFC 3339 with an offset): not before 1970-01-01T00:00:00Z, "
            "at most 100 years ahead (a range JSON Schema cannot state for a date-time)."
        },
    )
    delay_seconds = RuledNumber(
        rules.delay_seconds,
        metadata={
            "description": "Deliver this many seconds from now (database clock).",
            **bounds(0, rules.MAX_DELAY_SECONDS),
        },
    )

    # Also when a field failed: rules.new_event names every broken rule at once.
    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _when(self, data: dict[str, Any], original: Any, **kwargs: Any) -> None:
        if isinstance(original, dict):
            errors = rules.check_when(original)
            if errors:
                raise ValidationError(errors)  # type: ignore[arg-type]


class MatchingSchema(Schema):
    """Which events a bulk call touches: a group and/or a key prefix, at least one."""

    openapi_extra: ClassVar[dict[str, Any]] = patterns.AT_LEAST_ONE_FILTER

    group_key = Key()
    item_key_prefix = Key()

    @validates_schema
    def _filter(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "group_key" not in data and "item_key_prefix" not in data:
            raise ValidationError("Give group_key and/or item_key_prefix.")
