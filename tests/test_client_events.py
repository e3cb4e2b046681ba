"""The Python client against the real server: scheduling, moving, cancelling, reading, tracing and
searching events by key, with typed results and problem+json answers as typed exceptions."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tickler_client import (
    BatchResult,
    Client,
    Conflict,
    Event,
    NewEvent,
    NotFound,
    PreconditionFailed,
    TicklerError,
    ValidationError,
)

from tests.helpers import written

KEY = "welcome:ana+1@exämple.com"  # `:`, `@`, `+` and non-ASCII round-trip through the URL


def test_schedule_returns_a_typed_event_and_the_key_round_trips(tickler: Client) -> None:
    due = datetime(2030, 1, 2, 10, 30, tzinfo=timezone(timedelta(hours=1)))
    event = tickler.schedule("emails", KEY, {"template": "welcome"}, schedule_on=due, group_key="ana", max_attempts=3)
    assert isinstance(event, Event)
    assert (event.item_key, event.group_key, event.queue, event.outcome) == (KEY, "ana", "emails", "created")
    assert event.schedule_on == datetime(2030, 1, 2, 9, 30, tzinfo=UTC)
    assert event.schedule_on.tzinfo is not None and isinstance(event.enqueued_on, datetime)
    assert (event.status, event.version, event.max_attempts, event.redeliver_count) == ("pending", 1, 3, 0)
    assert event.enqueued_by == "signup-service"  # the token's principal, never the body
    assert event.data == {"template": "welcome"} and event.is_open
    assert tickler.get("emails", KEY) == dataclasses.replace(event, outcome=None)


def test_delay_as_seconds_or_timedelta_and_due_now(tickler: Client) -> None:
    now = datetime.now(UTC)
    later = tickler.schedule("emails", "a", delay=timedelta(hours=1))
    soon = tickler.schedule("emails", "b", delay=90)
    due = tickler.schedule("emails", "c")
    assert timedelta(minutes=59) < later.schedule_on - now < timedelta(minutes=61)
    assert timedelta(seconds=80) < soon.schedule_on - now < timedelta(seconds=100)
    assert due.schedule_on - now < timedelta(seconds=30)


def test_a_naive_datetime_is_refused_before_sending(tickler: Client, raw: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError, match="timezone") as caught:
        tickler.schedule("emails", "k", schedule_on=datetime(2030, 1, 1, 9, 0))
    assert isinstance(caught.value, TicklerError) and caught.value.status == 0
    assert list(caught.value.errors) == ["schedule_on"]
    with pytest.raises(ValidationError, match="timezone"):
        tickler.schedule_batch("emails", [NewEvent("k", schedule_on=datetime(2030, 1, 1, 9, 0))])
    with pytest.raises(ValidationError) as caught:
        tickler.schedule("emails", "k", {"n": float("nan")})  # JSON has no NaN: refused before sending
    assert list(caught.value.errors) == ["body"]
    assert written(raw) == (0, 0)


def test_conflict_carries_the_existing_event(tickler: Client) -> None:
    first = tickler.schedule("emails", KEY, {"n": 1}, delay=3600)
    with pytest.raises(Conflict) as caught:
        tickler.schedule("emails", KEY, {"n": 2})
    conflict = caught.value
    assert conflict.status == 409 and conflict.problem["status"] == 409 and conflict.title
    assert conflict.event is not None
    assert (conflict.event.id, conflict.event.data, conflict.event.schedule_on) == (
        first.id,
        {"n": 1},
        first.schedule_on,
    )


def test_on_conflict_ignore_and_replace(tickler: Client) -> None:
    first = tickler.schedule("emails", KEY, {"n": 1}, delay=3600)
    ignored = tickler.schedule("emails", KEY, {"n": 2}, on_conflict="ignore")
    assert (ignored.outcome, ignored.id, ignored.data) == ("ignored", first.id, {"n": 1})
    replaced = tickler.schedule("emails", KEY, {"n": 3}, delay=60, on_conflict="replace")
    assert (replaced.outcome, replaced.id, replaced.data) == ("replaced", first.id, {"n": 3})
    assert replaced.version > first.version


def test_reschedule_with_if_version_then_a_stale_version_is_refused(tickler: Client) -> None:
    event = tickler.schedule("emails", KEY, {"n": 1}, delay=3600, group_key="ana")
    moved = tickler.reschedule("emails", KEY, schedule_on="2031-05-01T08:00:00+02:00", if_version=event.version)
    assert moved.schedule_on == datetime(2031, 5, 1, 6, 0, tzinfo=UTC)
    assert moved.version == event.version + 1
    with pytest.raises(PreconditionFailed) as caught:
        tickler.reschedule("emails", KEY, delay=10, if_version=event.version)
    assert caught.value.status == 412
    changed = tickler.reschedule("emails", KEY, data={"n": 2}, group_key=None)
    assert (changed.data, changed.group_key, changed.schedule_on) == ({"n": 2}, None, moved.schedule_on)
    assert tickler.timeline("emails", KEY).actions == ["enqueued", "rescheduled", "updated"]


def test_cancel_with_reason_and_if_version_then_the_timeline_tells_it(tickler: Client) -> None:
    event = tickler.schedule("emails", KEY, delay=3600)
    with pytest.raises(PreconditionFailed):
        tickler.cancel("emails", KEY, if_version=event.version + 5)
    cancelled = tickler.cancel("emails", KEY, reason="unsubscribed", if_version=event.version)
    assert (cancelled.status, cancelled.dequeued_by, cancelled.is_open) == ("cancelled", "signup-service", False)
    assert isinstance(cancelled.dequeued_on, datetime)
    with pytest.raises(NotFound):
        tickler.cancel("emails", KEY)
    timeline = tickler.timeline("emails", KEY)
    assert timeline.item_key == KEY and timeline.actions == ["enqueued", "cancelled"]
    enqueued, last = timeline.entries
    assert (enqueued.actor, enqueued.event_id, enqueued.schedule_on) == ("signup-service", event.id, event.schedule_on)
    assert last.details["reason"] == "unsubscribed" and isinstance(last.at, datetime)
    assert tickler.get("emails", KEY).status == "cancelled"  # the most recent, once none is open


def test_moving_or_cancelling_an_event_in_flight_is_a_conflict(tickler: Client) -> None:
    tickler.schedule("emails", KEY)
    [lease] = tickler.claim("emails", worker="w1")
    with pytest.raises(Conflict):
        tickler.cancel("emails", KEY)
    with pytest.raises(Conflict):
        tickler.reschedule("emails", KEY, delay=60)
    tickler.ack(lease)


def test_cancel_matching_by_group_or_prefix(tickler: Client) -> None:
    for i in range(3):
        tickler.schedule("emails", f"digest:{i}", group_key="ana", delay=60)
    tickler.schedule("emails", "welcome:bob", delay=60)
    assert tickler.cancel_matching("emails", group_key="ana", reason="account closed") == 3
    assert tickler.cancel_matching("emails", item_key_prefix="welcome:") == 1
    assert tickler.cancel_matching("emails", item_key_prefix="welcome:") == 0
    with pytest.raises(ValidationError) as caught:
        tickler.cancel_matching("emails")
    assert caught.value.errors


def test_unknown_keys_are_not_found(tickler: Client) -> None:
    for call in (tickler.get, tickler.timeline, tickler.cancel):
        with pytest.raises(NotFound) as caught:
            call("emails", "never-seen")
        assert caught.value.status == 404 and caught.value.detail


def test_search_follows_next_cursor_across_pages(tickler: Client) -> None:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    keys = [f"k{i:02}" for i in range(23)]
    for i, key in enumerate(keys):
        tickler.schedule(
            "emails", key, {"i": i}, schedule_on=base + timedelta(minutes=i), group_key="g" if i % 2 else None
        )
    first = tickler.search_page("emails", page_size=10)
    assert len(first.events) == 10 and first.next_cursor is not None
    second = tickler.search_page("emails", page_size=10, cursor=first.next_cursor)
    assert [e.item_key for e in second.events] == keys[10:20]
    with pytest.warns(DeprecationWarning, match="page_size"):
        old_name = tickler.search_page("emails", limit=10, cursor=first.next_cursor)  # the old name still works
    assert old_name == second
    found = list(tickler.search("emails", page_size=7))  # four requests: 7 + 7 + 7 + 2
    assert [e.item_key for e in found] == keys
    assert all(isinstance(e, Event) for e in found)
    odd = [e.item_key for e in tickler.search("emails", group_key="g", page_size=3)]
    assert odd == keys[1::2]
    tickler.cancel("emails", "k05")
    assert [e.item_key for e in tickler.search("emails", status="cancelled")] == ["k05"]
    assert len(list(tickler.search("emails", status=["pending", "cancelled"], item_key_prefix="k1"))) == 10
    assert tickler.search_page("emails", item_key_prefix="zzz").next_cursor is None


def test_search_sorts_by_last_change(tickler: Client) -> None:
    for key in ("a", "b", "c"):
        tickler.schedule("emails", key, delay=60)
    tickler.reschedule("emails", "a", delay=120)  # now the latest change
    newest = list(tickler.search("emails", sort="-changed", page_size=2))
    assert [e.item_key for e in newest] == ["a", "c", "b"]
    latest, before = newest[0].changed_on, newest[1].changed_on
    assert latest is not None and before is not None and latest > before
    assert [e.item_key for e in tickler.search("emails", sort="changed")] == ["b", "c", "a"]
    with pytest.raises(ValidationError) as caught:
        list(tickler.search("emails", sort="newest"))
    assert "sort" in caught.value.errors


def test_search_by_due_time_window(tickler: Client) -> None:
    now = datetime.now(UTC)
    tickler.schedule("emails", "past", schedule_on=now - timedelta(minutes=5))
    tickler.schedule("emails", "soon", schedule_on=now + timedelta(minutes=30))
    tickler.schedule("emails", "later", schedule_on=now + timedelta(hours=3))
    window = tickler.search("emails", due_from=now, due_until=now + timedelta(hours=1))
    assert [e.item_key for e in window] == ["soon"]
    assert [e.item_key for e in tickler.search("emails", status="due", due_until=now)] == ["past"]
    with pytest.raises(ValidationError) as caught:
        list(tickler.search("emails", due_until=datetime(2026, 1, 1)))  # naive: refused before a request
    assert "due_until" in caught.value.errors


def test_search_validation_is_per_field(tickler: Client) -> None:
    with pytest.raises(ValidationError) as caught:
        list(tickler.search("emails", status="lost"))
    assert "status" in caught.value.errors


def test_schedule_batch_with_new_events_and_dicts(tickler: Client) -> None:
    tickler.schedule("emails", "taken", delay=60)
    results = tickler.schedule_batch(
        "emails",
        [NewEvent("a", {"n": 1}, delay=60, group_key="g"), {"item_key": "b", "data": {}}, NewEvent("taken")],
    )
    assert [(r.item_key, r.outcome) for r in results] == [("a", "created"), ("b", "created"), ("taken", "rejected")]
    assert all(isinstance(r, BatchResult) and isinstance(r.id, int) for r in results)
    assert tickler.get("emails", "a").group_key == "g"
    again = tickler.schedule_batch("emails", [NewEvent("a"), NewEvent("c")], on_conflict="ignore")
    assert [r.outcome for r in again] == ["ignored", "created"]


def test_an_invalid_batch_names_the_item_and_writes_nothing(tickler: Client, raw: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        tickler.schedule_batch("emails", [NewEvent("ok"), NewEvent("bad/key"), NewEvent("x", delay=-1)])
    assert {"events[1].item_key", "events[2].delay_seconds"} <= caught.value.errors.keys()
    assert all(isinstance(m, str) for messages in caught.value.errors.values() for m in messages)
    assert written(raw) == (0, 0)


def test_validation_errors_keep_every_field(tickler: Client, raw: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        tickler.schedule("emails", "k", delay=-1, max_attempts=0)
    error = caught.value
    assert {"delay_seconds", "max_attempts"} <= error.errors.keys()
    assert error.status == 400 and error.problem["errors"] == error.errors and error.type.endswith("validation")
    with pytest.raises(ValidationError) as both:
        tickler.schedule("emails", "k", delay=5, schedule_on=datetime.now(UTC))
    assert both.value.errors
    assert written(raw) == (0, 0)


def test_the_readme_walk_through_runs(
    tickler: Client, live_server: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKEN", token)  # the README's Python reads the token the shell exported
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## The same from Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    printed: list[tuple[Any, ...]] = []
    exec(code.replace("http://localhost:8080", live_server), {"TOKEN": token, "print": lambda *a: printed.append(a)})
    assert [(line[1], line[2]) for line in printed] == [
        ("enqueued", "signup-service"),
        ("rescheduled", "signup-service"),
        ("cancelled", "signup-service"),
    ]
    assert isinstance(printed[0][0], datetime) and printed[2][3] == {"reason": "unsubscribed"}
