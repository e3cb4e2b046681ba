"""What apispec cannot derive from a marshmallow schema: rules across fields (a schema class's
`openapi_extra`, written beside the validator it describes) and limits that are settings."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from tickler.config import Settings


def add_schema_extras(document: dict[str, Any], registered: dict[str, type[Schema]]) -> None:
    components = document["components"]["schemas"]
    for name, schema in registered.items():
        extra = getattr(schema, "openapi_extra", None)
        if extra:
            components[name].update(extra)


def add_setting_limits(document: dict[str, Any], settings: Settings) -> None:
    """Limits an operator may change (TICKLER_MAX_BATCH_EVENTS, TICKLER_MAX_PAGE_SIZE)."""
    components = document["components"]["schemas"]
    components["Batch"]["properties"]["events"].update(minItems=1, maxItems=settings.max_batch_events)
    claim = components["Claim"]["properties"]["wait_seconds"]
    claim["maximum"] = min(claim["maximum"], settings.max_wait_seconds)
    search = document["paths"]["/v1/queues/{queue}/events"]["get"]["parameters"]
    for parameter in search:
        if parameter["name"] == "limit":
            parameter["schema"]["maximum"] = settings.max_page_size


def exclusive_bounds(converter: Any, field: fields.Field, **kwargs: Any) -> dict[str, Any]:  # type: ignore[type-arg]
    """An apispec attribute function: apispec writes `Range(min=0, min_inclusive=False)` as
    `minimum: 0`, which admits the 0 the validator refuses; add the exclusive bound."""
    bounds: dict[str, Any] = {}
    for validator in field.validators:
        if isinstance(validator, validate.Range):
            if validator.min is not None and not validator.min_inclusive:
                bounds["exclusiveMinimum"] = validator.min
            if validator.max is not None and not validator.max_inclusive:
                bounds["exclusiveMaximum"] = validator.max
    return bounds
