"""The upgrade to this release (migrations 0075 to 0079 and the code files): a database of the
previous release, filled with open, grouped, in-flight, delivered, dead and cancelled events, is
upgraded, and everything a client reads is the same; the new tables start empty, the upcoming-load
counters count the events written before them, a queue whose groups carried fairness keys
keeps refusing a group without one, and each open event's last change is its latest timeline entry."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests import pg
from tests.previous_schedule import schedule_as_earlier_releases
from tests.test_upgrade import add_queue, give_this_release_claim_call, previous_cancel, without_added
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import SearchFilter, Store
from tickler.scheduler.store.search import ALL_STATUSES

PREVIOUS_RELEASE = 74  # the last migration of the previous release


@pytest.fixture
def previous(admin_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Store, psycopg.Connection[Any]]]:
    schedule_as_earlier_releases(monkeypatch)  # its tickler_schedule(), until the upgrade
    database = pg.migrated_database(admin_url, "tickler_upgrade_release", through=PREVIOUS_RELEASE, pool_size=2)
    with database as (url, engine, raw):
        give_this_release_claim_call(raw)
        yield url, Store(engine), raw


def reads(store: Store, keys: list[str], now: datetime) -> dict[str, Any]:
    """What a client reads of the queue: each key's event and timeline, a search, the counts."""
    return {
        "events": {key: without_added(store.events.get("emails", key)) for key in keys},
        "timelines": {key: store.events.timeline("emails", key) for key in keys},
        "search": [
            without_added(e)
            for e in store.events.search("emails", SearchFilter(statuses=ALL_STATUSES, limit=100), now=now)
        ],
        "counts": store.queues.counts("emails", now=now),
    }


def test_an_upgrade_to_this_release_keeps_what_clients_read(
    previous: tuple[str, Store, psycopg.Connection[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, store, raw = previous
    queue = add_queue(store.engine, store, "emails", max_attempts=1)
    store.events.schedule_batch(
        queue,
        [
            NewEvent("later", {"n": 1}, delay_seconds=3600),
            NewEvent("grouped-1", {"n": 2}, group_key="ana", fairness_key="ana", delay_seconds=7200),
            *(NewEvent(key, {"n": 3}) for key in ("in-flight", "delivered", "dead")),
            NewEvent("cancelled", {"n": 4}, delay_seconds=60),
        ],
        actor="app",
    )
    now = raw.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    leases = {lease.events[0].item_key: lease for lease in store.leases.claim(queue, worker="w", limit=10)}
    assert sorted(leases) == ["dead", "delivered", "in-flight"]
    store.leases.ack([leases["delivered"].lease_id])
    store.leases.nack(leases["dead"].lease_id, error="receiver said no", dead=True)
    previous_cancel(store.engine, "emails", "cancelled", actor="app")
    raw.execute(  # a reschedule, as the timeline records it: a change no time column of the event shows
        "WITH moved AS (UPDATE tickler_event SET schedule_on = schedule_on + interval '1 hour', version = version + 1"
        " WHERE item_key = 'later' RETURNING *)"
        " INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on)"
        " SELECT queue, item_key, id, clock_timestamp(), 'rescheduled', 'app', schedule_on FROM moved"
    )
    keys = ["later", "grouped-1", "in-flight", "delivered", "dead", "cancelled"]
    before = reads(store, keys, now)

    applied = [step.label for step in migrate(url)]
    monkeypatch.undo()  # this release's statements from here on
    assert {
        "0075_erasures",
        "0076_operations_log",
        "0077_grouped_fairness",
        "0078_token_last_used",
        "0079_event_changed_on",
    } <= {label.removesuffix(".sql") for label in applied}

    assert reads(store, keys, now) == before
    # each open event last changed when its latest timeline entry was written (the in-flight one:
    # its claim); a finished one when it finished
    for key in keys:
        event = store.events.get("emails", key)
        assert event.changed_on == store.events.timeline("emails", key)[-1].at, key
        assert event.changed_on == (event.dequeued_on or event.changed_on), key
    assert raw.execute("SELECT count(*) FROM tickler_event WHERE changed_on IS NULL").fetchone() == (0,)
    # the new tables start empty; the forecast counts what was open before the counters existed
    for table in ("tickler_erasure", "tickler_operation_log"):
        assert raw.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    forecast = store.forecasts.forecast("emails", hours=3, bucket="hour")
    assert forecast.exact and sum(forecast.counts) + forecast.later == 2  # later, grouped-1 (not the leased one)
    # the queue's groups carried a fairness key: a grouped event without one is still refused
    assert raw.execute("SELECT grouped_fairness FROM tickler_queue WHERE name = 'emails'").fetchone() == (True,)
    with pytest.raises(sa.exc.IntegrityError, match="another fairness_key"):
        store.events.schedule_batch(queue, [NewEvent("grouped-2", {}, group_key="ana")], actor="app")
    # the lease taken before the upgrade is finished once after it
    store.leases.ack([leases["in-flight"].lease_id])
    assert store.events.get("emails", "in-flight").status == "delivered"
