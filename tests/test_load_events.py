"""The rules check every schedule runs (ScheduleEventSchema.load_event, BatchSchema.load_events)
accepts exactly what the schema accepts, loads it the same way, and refuses the rest with the
schema's own messages."""

from __future__ import annotations

from typing import Any

import pytest
from marshmallow import ValidationError

from tickler.api.schemas.events import BatchSchema, ScheduleEventSchema, data_is_certainly_storable

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


def _outcome(load: Any, body: Any) -> tuple[Any, Any]:
    """(what `load` returns, None) or (None, the messages of its ValidationError)."""
    try:
        return load(body), None
    except ValidationError as error:
        return None, error.messages


@pytest.mark.parametrize("body", CASES)
def test_the_rules_check_agrees_with_the_schema(body: dict[str, Any]) -> None:
    schema = BatchSchema(max_events=10)
    loaded, schema_errors = _outcome(schema.load, body)
    fast, errors = _outcome(schema.load_events, body)
    if loaded is None:
        assert fast is None  # never accept what the schema refuses
        assert errors == schema_errors  # and say why in its words
        return
    assert fast is not None, "a valid batch is loaded"
    events, on_conflict, debounce_max = fast
    assert on_conflict == loaded["on_conflict"]
    assert debounce_max == loaded.get("debounce_max_seconds")
    for event, item in zip(events, loaded["events"], strict=True):
        assert event.item_key == item["item_key"] and event.data == item["data"]
        assert event.group_key == item.get("group_key")
        assert event.schedule_on == item.get("schedule_on")
        assert event.delay_seconds == item.get("delay_seconds")
        assert event.max_attempts == item.get("max_attempts")


@pytest.mark.parametrize("body", CASES)
def test_a_single_event_is_checked_as_a_batch_item(body: dict[str, Any]) -> None:
    items = body.get("events")
    if type(items) is not list or len(items) != 1 or type(items[0]) is not dict:
        return
    single = {**items[0], **{k: v for k, v in body.items() if k != "events"}}
    schema = ScheduleEventSchema()
    loaded, schema_errors = _outcome(schema.load, single)
    fast, errors = _outcome(schema.load_event, single)
    if loaded is None:
        assert fast is None
        assert errors == schema_errors
        return
    assert fast is not None
    event, on_conflict, debounce_max = fast
    assert (event.item_key, event.data, event.group_key) == (
        loaded["item_key"],
        loaded["data"],
        loaded.get("group_key"),
    )
    assert (event.schedule_on, event.delay_seconds, event.max_attempts) == (
        loaded.get("schedule_on"),
        loaded.get("delay_seconds"),
        loaded.get("max_attempts"),
    )
    assert (on_conflict, debounce_max) == (loaded["on_conflict"], loaded.get("debounce_max_seconds"))


def test_too_many_events_are_refused_as_the_schema_says() -> None:
    body = {"events": [{"item_key": f"k{i}", "data": {}} for i in range(11)]}
    with pytest.raises(ValidationError) as refused:
        BatchSchema(max_events=10).load_events(body)
    assert refused.value.messages == {"events": ["At most 10 events per batch."]}


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
