"""The three doors for a new event — the API's schema, the rules check every schedule runs
(BatchSchema.load_events) and the importer's row check — accept and refuse the same events,
because scheduler.rules decides for all three."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from tickler.api.schemas.events import BatchSchema, NewEventSchema
from tickler.pipeline.validate import Invalid, check_row
from tickler.scheduler import rules

_schema = NewEventSchema()
_batch = BatchSchema(max_events=10)

keys = st.one_of(
    st.sampled_from(["k", "welcome:ana@example.com", ".", "..", "a/b", "a b", "", "é", "k" * 255, "k" * 256]),
    st.text(min_size=0, max_size=8),
)
times = st.one_of(
    st.sampled_from(
        [
            "2030-01-01T09:00:00Z",
            "2030-01-01T09:00:00+01:00",
            "2030-01-01T09:00:00.123456789z",
            "1969-12-31T23:59:59Z",
            "9999-12-31T23:59:59-23:59",
            "0001-01-01T00:00:00+01:00",
            "2030-02-30T09:00:00Z",
            "2030-01-01 09:00:00Z",
            "2030-01-01T09:00:00",
            "\u0662\u0660\u0663\u0660-01-01T09:00:00Z"  # Arabic-Indic digits,
            "2200-01-01T00:00:00Z",
            "",
        ]
    ),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.text(max_size=30),
)
numbers = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.0, -0.0, 3162240000, 3162240000.5, 1000, 1001, 1, 2.0]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
# Each field: absent, a value of the right kind, or something else a client might send.
fields: dict[str, Any] = {
    "item_key": keys | json_values,
    "group_key": keys | st.none() | json_values,
    "schedule_on": times | json_values,
    "delay_seconds": numbers | st.booleans() | json_values,
    "data": st.dictionaries(st.text(max_size=4), json_values, max_size=3) | json_values,
    "max_attempts": numbers | st.booleans() | json_values,
}
items = st.fixed_dictionaries({}, optional=fields).flatmap(
    lambda d: st.one_of(st.just(d), st.just({**d, "colour": "red"}))
)


def _by_schema(item: dict[str, Any]) -> set[str] | None:
    """The fields the schema names, or None when it accepts the event."""
    try:
        _schema.load(item)
    except ValidationError as error:
        assert isinstance(error.messages, dict)
        return set(error.messages)
    return None


def _as_text(value: Any) -> str | None:
    """The cell an import file would hold for a JSON value; None when a cell cannot say it alike."""
    if isinstance(value, str):
        return value or None  # an empty cell means "not given", which "" is not in JSON
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return None


def _by_importer(item: dict[str, Any], now: datetime) -> str | None:
    """The field of the importer's first reason, or None when it takes the row."""
    try:
        check_row({"queue": "emails", **{k: _as_text(v) for k, v in item.items()}}, queues={"emails"}, now=now,
                  max_data_bytes=10**9)  # fmt: skip
    except Invalid as error:
        return str(error).split(":", 1)[0]
    return None


def _importer_can_say(item: dict[str, Any]) -> bool:
    """Text cells carry strings, numbers and objects, each in its own column; not every JSON value."""
    if "colour" in item:
        return False
    for name, value in item.items():
        text = _as_text(value)
        if text is None:
            return False
        if name in ("delay_seconds", "max_attempts") and isinstance(value, str):
            return False  # "60" is a string in JSON but a number in a cell
        if name in ("item_key", "group_key", "schedule_on") and not isinstance(value, str):
            return False
        if name == "data" and not isinstance(value, dict):
            return False
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=items)
@example(item={"item_key": "k", "data": {}, "schedule_on": "9999-12-31T23:59:59-23:59"})
@example(item={"item_key": "..", "data": {}})
@example(item={"item_key": "k", "data": {}, "schedule_on": "2030-01-01T09:00:00Z", "delay_seconds": 1})
@example(item={"item_key": "k", "data": {}, "max_attempts": 2.0})
@example(item={"item_key": "k", "data": {"": "\x00"}})
def test_schema_rules_check_and_importer_agree(item: dict[str, Any]) -> None:
    now = datetime.now(UTC)
    refused = _by_schema(item)
    try:
        fast = _batch.load_events({"events": [item]})
    except ValidationError:
        fast = None
    assert (fast is not None) == (refused is None), (item, refused)
    if fast is not None:
        loaded = _schema.load(item)
        event = fast[0][0]
        assert (event.item_key, event.data, event.group_key) == (
            loaded["item_key"],
            loaded["data"],
            loaded.get("group_key"),
        )
        assert (event.schedule_on, event.delay_seconds, event.max_attempts) == (
            loaded.get("schedule_on"), loaded.get("delay_seconds"), loaded.get("max_attempts"))  # fmt: skip
    if _importer_can_say(item):
        field = _by_importer(item, now)
        # The API checks data's content and size after the schema, in the view (a size is a 413,
        # not a 400); the importer checks all of it per row. Compare with the API's whole answer.
        api_refused = refused
        if api_refused is None and rules.check_data(item["data"], max_bytes=10**9) is not None:
            api_refused = {"data"}
        if api_refused is None:
            assert field is None, (item, field)
        else:
            assert field in api_refused, (item, api_refused, field)
