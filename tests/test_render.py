"""Responses show an event as EventSchema (the OpenAPI document's schema) dumps it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tickler.api.render import event_json
from tickler.api.schemas.events import EventSchema
from tickler.scheduler.models import Event

_AT = datetime(2026, 11, 24, 5, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))


@pytest.mark.parametrize(
    "event",
    [
        Event(1, "q", "k", None, _AT, {}, "scheduled", _AT, "svc", None, None, None, None, 0, 10, None, 1),
        Event(
            2,
            "q",
            "k",
            "g",
            _AT,
            {"a": [1, 2.5, None]},
            "dead",
            _AT.astimezone(UTC),
            "svc",
            _AT,
            "worker",
            _AT,
            "worker",
            3,
            3,
            "boom",
            7,
            priority=-5,
            fairness_key="tenant",
            lease_id="x",
            traceparent="t",
        ),
    ],
)
def test_event_json_is_what_the_schema_dumps(event: Event) -> None:
    assert event_json(event) == EventSchema().dump(event)
    assert list(event_json(event)) == list(EventSchema().dump(event))  # the same key order
    assert event_json(event, outcome="created") == {**EventSchema().dump(event), "outcome": "created"}
