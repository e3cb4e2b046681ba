"""The Python client's priority and fair-share arguments (SPEC §10), against the real server."""

from __future__ import annotations

import pytest
from tickler_client import Client, NewEvent, ValidationError


def test_schedule_batch_reschedule_and_search_carry_priority_and_fairness_key(tickler: Client) -> None:
    event = tickler.schedule("emails", "a", {}, delay=60, priority=5, fairness_key="tenant-1")
    assert (event.priority, event.fairness_key) == (5, "tenant-1")
    tickler.schedule_batch("emails", [NewEvent("b", delay=60, priority=-2), NewEvent("c", delay=60)])
    assert tickler.get("emails", "b").priority == -2
    assert tickler.get("emails", "c").priority == 0 and tickler.get("emails", "c").fairness_key is None
    moved = tickler.reschedule("emails", "a", priority=9, fairness_key=None)
    assert (moved.priority, moved.fairness_key) == (9, None)
    assert [e.item_key for e in tickler.search("emails", priority=-2)] == ["b"]
    assert [e.item_key for e in tickler.search_page("emails", priority=9).events] == ["a"]
    with pytest.raises(ValidationError) as refused:
        tickler.schedule("emails", "d", {}, priority=101)
    assert "priority" in refused.value.errors


def test_put_queue_sets_fair_share_and_the_per_key_cap(admin: Client) -> None:
    queue = admin.put_queue("tenants", fair_share=True, max_in_flight_per_key=2)
    assert queue.fair_share is True and queue.max_in_flight_per_key == 2
    cleared = admin.put_queue("tenants", max_in_flight_per_key=None)
    assert cleared.fair_share is True and cleared.max_in_flight_per_key is None
