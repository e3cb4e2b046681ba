"""The Python client's recurring-schedule calls against the real server (SPEC §6)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from tickler_client import Client, NotFound, Schedule, ValidationError

LISBON = ZoneInfo("Europe/Lisbon")


def test_put_get_list_and_delete_a_schedule(tickler: Client) -> None:
    created = tickler.put_schedule(
        "emails", "daily-digest", cron="0 9 * * *", timezone="Europe/Lisbon", data={"kind": "digest"}, group_key="d"
    )
    assert isinstance(created, Schedule)
    assert (created.schedule_key, created.queue, created.cron, created.timezone) == (
        "daily-digest",
        "emails",
        "0 9 * * *",
        "Europe/Lisbon",
    )
    assert (created.data, created.group_key, created.catch_up, created.paused) == (
        {"kind": "digest"},
        "d",
        "latest",
        False,
    )
    assert len(created.next_occurrences) == 5
    assert all(isinstance(t, datetime) and t.astimezone(LISBON).hour == 9 for t in created.next_occurrences)
    assert created.created_by == "signup-service" and isinstance(created.created_on, datetime)

    # the next occurrence waits as an ordinary event, keyed {schedule_key}@{occurrence}
    [waiting] = list(tickler.search("emails", item_key_prefix="daily-digest@"))
    assert (waiting.status, waiting.enqueued_by, waiting.schedule_on) == (
        "pending",
        "schedule:daily-digest",
        created.next_occurrences[0],
    )
    assert tickler.get_schedule("emails", "daily-digest") == created

    changed = tickler.put_schedule("emails", "daily-digest", cron="30 7 * * 1-5", timezone="UTC", paused=True)
    assert (changed.cron, changed.paused, changed.version > created.version) == ("30 7 * * 1-5", True, True)
    assert tickler.timeline("emails", "daily-digest").actions[:2] == ["schedule_created", "schedule_updated"]

    for key in ("b-weekly", "a-hourly"):
        tickler.put_schedule("emails", key, cron="0 * * * *")
    listed = tickler.list_schedules("emails", page_size=2)  # two pages
    assert [s.schedule_key for s in listed] == ["a-hourly", "b-weekly", "daily-digest"]

    deleted = tickler.delete_schedule("emails", "a-hourly")
    assert deleted.schedule_key == "a-hourly"
    assert {e.status for e in tickler.search("emails", item_key_prefix="a-hourly@")} <= {"cancelled"}
    with pytest.raises(NotFound):
        tickler.get_schedule("emails", "a-hourly")
    with pytest.raises(NotFound):
        tickler.delete_schedule("emails", "a-hourly")
    assert tickler.timeline("emails", "a-hourly").actions[-1] == "schedule_deleted"


def test_invalid_schedules_name_their_fields(tickler: Client) -> None:
    with pytest.raises(ValidationError) as cron:
        tickler.put_schedule("emails", "bad", cron="every day")
    assert "cron" in cron.value.errors
    with pytest.raises(ValidationError) as zone:
        tickler.put_schedule("emails", "bad", cron="0 9 * * *", timezone="Mars/Olympus")
    assert "timezone" in zone.value.errors
    with pytest.raises(ValidationError) as key:
        tickler.put_schedule("emails", "a@b", cron="0 9 * * *")
    assert "schedule_key" in key.value.errors
    assert tickler.list_schedules("emails") == []
