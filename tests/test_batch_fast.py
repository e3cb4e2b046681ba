"""The batch fast path accepts only what the schema accepts, and loads it the same way."""

from __future__ import annotations

from typing import Any

import pytest
from marshmallow import ValidationError

from tickler.api.batch_fast import data_is_certainly_storable, valid_batch
from tickler.api.schemas.events import BatchSchema

GOOD = {"item_key": "welcome:ana@example.com", "data": {"a": 1}}

CASES: list[dict[str, Any]] = [
    {"events": [GOOD]},
    {"events": [GOOD], "on_conflict": "replace"},
    {"events": [GOOD], "on_conflict": "debounce"},
    {"events": [GOOD], "on_conflict": "debounce", "debounce_max_seconds": 60},
    {"events": [{**GOOD, "group_key": "g", "schedule_on": "2026-11-22T09:00:00+01:00", "max_attempts": 3}]},
    {"events": [{**GOOD, "group_key": None, "delay_seconds": 0}]},
    {"events": [{**GOOD, "delay_seconds": 1.5}, {"item_key": "other", "data": {}}]},
    # each of these the schema refuses
    {"events": []},
    {"events": [GOOD, GOOD]},
    {"events": [GOOD], "extra": 1},
    {"events": [GOOD], "on_conflict": "merge"},
    {"events": [GOOD], "debounce_max_seconds": 60},
    {"events": [GOOD], "on_conflict": "debounce", "debounce_max_seconds": -1},
    {"events": [GOOD], "on_conflict": "debounce", "debounce_max_seconds": "60"},
    {"events": [GOOD], "on_conflict": None},
    {"events": GOOD},
    {"events": [{**GOOD, "extra": 1}]},
    {"events": [{"item_key": "k"}]},
    {"events": [{"data": {}}]},
    {"events": [{**GOOD, "item_key": "a/b"}]},
    {"events": [{**GOOD, "item_key": ""}]},
    {"events": [{**GOOD, "item_key": 7}]},
    {"events": [{**GOOD, "group_key": "a b"}]},
    {"events": [{**GOOD, "data": []}]},
    {"events": [{**GOOD, "data": None}]},
    {"events": [{**GOOD, "schedule_on": "2026-11-22 09:00:00Z"}]},
    {"events": [{**GOOD, "schedule_on": "2026-11-22T09:00:00"}]},
    {"events": [{**GOOD, "schedule_on": "1969-12-31T23:59:59Z"}]},
    {"events": [{**GOOD, "schedule_on": None}]},
    {"events": [{**GOOD, "schedule_on": "2026-11-22T09:00:00Z", "delay_seconds": 1}]},
    {"events": [{**GOOD, "delay_seconds": -1}]},
    {"events": [{**GOOD, "delay_seconds": True}]},
    {"events": [{**GOOD, "delay_seconds": "5"}]},
    {"events": [{**GOOD, "delay_seconds": 10**12}]},
    {"events": [{**GOOD, "max_attempts": 0}]},
    {"events": [{**GOOD, "max_attempts": 1.0}]},
    {"events": [{**GOOD, "max_attempts": False}]},
    {"events": [{**GOOD, "max_attempts": 1001}]},
    {"events": ["not an object"]},
]


@pytest.mark.parametrize("body", CASES)
def test_fast_path_agrees_with_the_schema(body: dict[str, Any]) -> None:
    try:
        loaded = BatchSchema(max_events=10).load(body)
    except ValidationError:
        loaded = None
    fast = valid_batch(body, max_events=10)
    if loaded is None:
        assert fast is None  # never accept what the schema refuses
        return
    assert fast is not None, "a valid batch should take the fast path"
    events, on_conflict, debounce_max = fast
    assert on_conflict == loaded["on_conflict"]
    assert debounce_max == loaded.get("debounce_max_seconds")
    for event, item in zip(events, loaded["events"], strict=True):
        assert event.item_key == item["item_key"] and event.data == item["data"]
        assert event.group_key == item.get("group_key")
        assert event.schedule_on == item.get("schedule_on")
        assert event.delay_seconds == item.get("delay_seconds")
        assert event.max_attempts == item.get("max_attempts")


def test_too_many_events_take_the_schema_path() -> None:
    assert valid_batch({"events": [{"item_key": f"k{i}", "data": {}} for i in range(11)]}, max_events=10) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"events":[{"item_key":"k","data":{"a":"b"}}]}', True),
        (b'{"events":[{"item_key":"k","data":{"a":"\\u0000"}}]}', False),
        (b'{"events":[{"item_key":"k","data":{"a":"\\ud800"}}]}', False),
        (b'{"events":[{"item_key":"k","data":{"a":"\\u00e9"}}]}', True),
        (b"x" * 101, False),
    ],
)
def test_data_is_certainly_storable(raw: bytes, expected: bool) -> None:
    assert data_is_certainly_storable(raw, 100) is expected
