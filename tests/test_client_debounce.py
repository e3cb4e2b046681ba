"""The Python client's `schedule(on_conflict="debounce")` against the real server (SPEC §6)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from tickler_client import Client, Conflict, NewEvent


def test_debounce_takes_the_latest_data_and_time(tickler: Client) -> None:
    first = tickler.schedule("emails", "digest:ana", {"n": 1}, delay=60, on_conflict="debounce")
    assert first.outcome == "created"
    later = tickler.schedule("emails", "digest:ana", {"n": 2}, delay=120, group_key="ana", on_conflict="debounce")
    assert (later.outcome, later.id, later.data, later.group_key) == ("debounced", first.id, {"n": 2}, "ana")
    assert later.schedule_on > first.schedule_on
    entry = tickler.timeline("emails", "digest:ana").entries[-1]
    assert entry.action == "debounced" and entry.schedule_on == later.schedule_on
    assert str(first.schedule_on.year) in str(entry.details)  # the previous time is recorded


def test_debounce_max_seconds_caps_the_delay(tickler: Client) -> None:
    first = tickler.schedule("emails", "k", delay=10, on_conflict="debounce", debounce_max_seconds=30)
    capped = tickler.schedule(
        "emails", "k", delay=3600, on_conflict="debounce", debounce_max_seconds=timedelta(seconds=30)
    )
    assert capped.outcome == "debounced"
    assert capped.schedule_on == first.enqueued_on + timedelta(seconds=30)


def test_debounce_of_an_event_in_flight_is_a_conflict(tickler: Client) -> None:
    tickler.schedule("emails", "k")
    [lease] = tickler.claim("emails", worker="w")
    with pytest.raises(Conflict):
        tickler.schedule("emails", "k", delay=60, on_conflict="debounce")
    tickler.ack(lease)


def test_debounce_in_a_batch(tickler: Client) -> None:
    first = tickler.schedule("emails", "a", {"n": 1}, delay=10)
    results = tickler.schedule_batch(
        "emails", [NewEvent("a", {"n": 2}, delay=3600), NewEvent("b")], on_conflict="debounce", debounce_max_seconds=60
    )
    assert [(r.item_key, r.outcome) for r in results] == [("a", "debounced"), ("b", "created")]
    moved = tickler.get("emails", "a")
    assert (moved.data, moved.schedule_on) == ({"n": 2}, first.enqueued_on + timedelta(seconds=60))
