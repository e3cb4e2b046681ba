"""One input row of an import, checked with the API's rules (scheduler.rules), field by field.

Values arrive as text (a CSV cell, or a Parquet value the importer turned into text): empty or
missing means "not given". A good row becomes the values the staging table takes; a bad one, the
first reason it fails, spelled `field: message` as the API's `errors` object would say it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Container, Mapping
from datetime import datetime
from typing import Any

from scheduler import rules

# Columns an import file may have; `item_key` and `data` are required (as in the API), `queue`
# unless --queue names it.
FIELDS = ("queue", "item_key", "group_key", "schedule_on", "delay_seconds", "data", "max_attempts")
_INTEGER = re.compile(r"^[+-]?\d+$")

Staged = tuple[str, str, str | None, str | None, float | None, str, int | None]


class Invalid(ValueError):
    """A row breaks a rule; the message names the field."""


def _given(row: Mapping[str, Any], field: str) -> str | None:
    value = row.get(field)
    return None if value is None or value == "" else str(value)


def _key(row: Mapping[str, Any], field: str, required: bool) -> str | None:
    value = _given(row, field)
    if value is None:
        if required:
            raise Invalid(f"{field}: Missing data for required field.")
        return None
    problem = rules.check_key(value)
    if problem:
        raise Invalid(f"{field}: {problem}")
    return value


def _when(row: Mapping[str, Any], now: datetime) -> tuple[str | None, float | None]:
    schedule_on, delay = _given(row, "schedule_on"), _given(row, "delay_seconds")
    if schedule_on is not None and delay is not None:
        raise Invalid("schedule_on: Give schedule_on or delay_seconds, not both.")
    if schedule_on is not None:
        try:
            when = rules.parse_rfc3339(schedule_on)
        except ValueError as error:
            raise Invalid(f"schedule_on: {error}") from None
        problem = rules.check_schedule_on(when, now)
        if problem:
            raise Invalid(f"schedule_on: {problem}")
        return rules.format_timestamp(when), None
    if delay is not None:
        try:
            seconds = float(delay)
        except ValueError:
            raise Invalid("delay_seconds: Not a valid number.") from None
        if not math.isfinite(seconds) or not 0 <= seconds <= rules.MAX_DELAY_SECONDS:
            raise Invalid(f"delay_seconds: Must be greater than or equal to 0 and less than or equal to "
                          f"{rules.MAX_DELAY_SECONDS}.")  # fmt: skip
        return None, seconds
    return None, None


def _data(row: Mapping[str, Any], max_bytes: int) -> str:
    text = _given(row, "data")
    if text is None:
        raise Invalid("data: Missing data for required field.")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        raise Invalid("data: Not valid JSON.") from None
    if not isinstance(data, dict):
        raise Invalid("data: Must be a JSON object.")
    problem = rules.check_data(data, max_bytes)
    if problem:
        raise Invalid(f"data: {problem[1]}")
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _max_attempts(row: Mapping[str, Any]) -> int | None:
    text = _given(row, "max_attempts")
    if text is None:
        return None
    if not _INTEGER.match(text):
        raise Invalid("max_attempts: Not a valid integer.")
    value = int(text)
    if not 1 <= value <= rules.MAX_ATTEMPTS_LIMIT:
        raise Invalid(f"max_attempts: Must be greater than or equal to 1 and less than or equal to "
                      f"{rules.MAX_ATTEMPTS_LIMIT}.")  # fmt: skip
    return value


def check_row(row: Mapping[str, Any], *, queues: Container[str], now: datetime, max_data_bytes: int) -> Staged:
    """The staged values of a good row: (queue, item_key, group_key, schedule_on, delay, data, max_attempts).

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
    item_key = _key(row, "item_key", required=True)
    assert item_key is not None
    group_key = _key(row, "group_key", required=False)
    schedule_on, delay = _when(row, now)
    data = _data(row, max_data_bytes)
    return queue, item_key, group_key, schedule_on, delay, data, _max_attempts(row)
