"""One input row of an import, checked with the API's rules (scheduler.rules), field by field.

Values arrive as text (a CSV cell, or a Parquet value the importer turned into text): empty or
missing means "not given". A good row becomes the values the staging table takes; a bad one, the
first reason it fails, spelled `field: message` as the API's `errors` object would say it.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from datetime import datetime
from typing import Any

from tickler.scheduler import rules, strict_json
from tickler.scheduler.trace_context import TraceContext

# Columns an import file may have: the fields of a new event in the API (`item_key` and `data`
# required), its `queue` (required unless --queue names it) and `traceparent` (SPEC §11: the
# producer's W3C trace context; a malformed one is ignored, as by the API).
FIELDS = ("queue", *rules.NEW_EVENT_FIELDS, "traceparent")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
# What float() reads, less its spellings of infinity and NaN and of digits in other scripts.
_NUMBER = re.compile(r"^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$")

Staged = tuple[str, str, str | None, str | None, float | None, str, int | None, int | None, str | None, str | None]


class Invalid(ValueError):
    """A row breaks a rule; the message names the field."""


def _given(row: Mapping[str, Any], field: str) -> str | None:
    value = row.get(field)
    return None if value is None or value == "" else str(value)


def _number(row: Mapping[str, Any], field: str, pattern: re.Pattern[str], kind: type[int] | type[float]) -> Any:
    """A cell's number, as JSON would have carried it (the rules then check it)."""
    text = _given(row, field)
    if text is None:
        return None
    if not pattern.match(text):
        raise Invalid(f"{field}: Not a valid {'integer' if kind is int else 'number'}.")
    if kind is int and not _INTEGER.match(text):
        return float(text)  # 2.0 or 2.5, as JSON would carry them: the rules decide what is an integer
    return kind(text)


def _data(row: Mapping[str, Any]) -> Any:
    text = _given(row, "data")
    if text is None:
        return None
    try:
        data = strict_json.loads_strict(text)  # exactly what the API takes as a body
    except strict_json.NotJSON:
        raise Invalid("data: Not valid JSON.") from None
    if not isinstance(data, dict):
        raise Invalid("data: Must be a JSON object.")
    return data


def check_row(row: Mapping[str, Any], *, queues: Container[str], now: datetime, max_data_bytes: int) -> Staged:
    """The staged values of a good row: (queue, item_key, group_key, schedule_on, delay, data, max_attempts,
    priority, fairness_key, traceparent).

    Raises Invalid with the reason of a bad one. `queues`: the queues that exist.
    """
    queue = _given(row, "queue")
    if queue is None:
        raise Invalid("queue: Missing data for required field.")
    problem = rules.check_queue_name(queue)
    if problem:
        raise Invalid(f"queue: {problem}")
    if queue not in queues:
        raise Invalid(f"queue: No queue named {queue!r}.")
    given: dict[str, Any] = {
        "item_key": _given(row, "item_key"),
        "group_key": _given(row, "group_key"),
        "schedule_on": _given(row, "schedule_on"),
        "delay_seconds": _number(row, "delay_seconds", _NUMBER, float),
        "data": _data(row),
        "max_attempts": _number(row, "max_attempts", _NUMBER, int),
        "priority": _number(row, "priority", _NUMBER, int),
        "fairness_key": _given(row, "fairness_key"),
    }
    try:
        # The API's rule for a new event decides; an empty cell is a field not given.
        event = rules.new_event({k: v for k, v in given.items() if v is not None}, now)
    except rules.RuleErrors as error:
        field = next(f for f in FIELDS if f in error.errors)
        raise Invalid(f"{field}: {error.errors[field][0]}") from None
    data, too_big_or_bad = rules.data_text(event.data, max_data_bytes)
    if too_big_or_bad:
        raise Invalid(f"data: {too_big_or_bad[1]}")
    schedule_on = rules.format_timestamp(event.schedule_on)
    return (
        queue,
        event.item_key,
        event.group_key,
        schedule_on,
        event.delay_seconds,
        data,
        event.max_attempts,
        event.priority,
        event.fairness_key,
        _traceparent(row),
    )


def _traceparent(row: Mapping[str, Any]) -> str | None:
    """The row's trace context, as the API keeps a header's: normalised, or None when malformed."""
    context = TraceContext.parse(_given(row, "traceparent"))
    return None if context is None else context.traceparent
