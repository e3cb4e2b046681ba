"""A finished event read by id stays one probe of one day of history (migration 0063: history has
no index by id alone; the key's timeline gives the event's queue, schedule_on and day)."""

from __future__ import annotations

import json
from datetime import UTC, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import plan_nodes
from tests.test_plans import fresh_install, plan, populated, scanned  # noqa: F401 (fixture)
from tickler.config import Settings
from tickler.scheduler.models import NewEvent
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.store.operations import EventOperations

DAYS = 5
EVENTS = 1_000_000
KEYS = EVENTS // DAYS  # each key finished once a day
OFFSET = 10**9  # history ids, above those the open events get

FILL = """
WITH moved AS (
    INSERT INTO tickler_event_history (queue, id, item_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on,
                                       dequeued_by, outcome, claimed_on, claimed_by, max_attempts, version)
    SELECT 'emails', %(offset)s + g, 'k' || (g %% %(keys)s), f.at - interval '1 minute', '{}',
           f.at - interval '2 minutes', 'load',
           f.at, 'w', CASE WHEN g %% 97 = 0 THEN 'dead' ELSE 'delivered' END, f.at, 'w', 3, 3
    FROM generate_series(CAST(%(start)s AS bigint), CAST(%(stop)s AS bigint)) AS g
    CROSS JOIN LATERAL (
        SELECT %(first_day)s + (g / %(keys)s) * interval '1 day' + (g %% %(keys)s) * interval '400 milliseconds' AS at
    ) AS f
    RETURNING queue, item_key, id, schedule_on, dequeued_on, outcome
)
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT queue, item_key, id, dequeued_on, outcome, 'w', schedule_on, '{}' FROM moved
"""


def buffers(raw: psycopg.Connection[Any], name: str, params: dict[str, Any], tables: set[str]) -> int:
    """Shared buffers the statement's reads of these tables touch when it runs (EXPLAIN ANALYZE,
    BUFFERS): a count that the box's load does not move."""
    [[result]] = raw.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {driver_sql(name)}", params).fetchall()
    return sum(
        int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
        for node in plan_nodes(result)
        if node.get("Relation Name") in tables
    )


def history_scans(plan_text: str, tables: set[str]) -> set[str]:
    """How a plan reads these history partitions (node type and index)."""
    return {
        f"{node['Node Type']}:{node.get('Index Name')}:{node.get('Index Cond')}"
        for node in plan_nodes(json.loads(plan_text))
        if node.get("Relation Name") in tables and "Node Type" in node
    }


@pytest.mark.slow
@pytest.mark.timeout(900)  # the fill: 1,000,000 history rows and their timeline, on a shared 2-core box
def test_a_finished_event_by_id_is_one_probe_of_its_day(
    fresh_install: tuple[Store, psycopg.Connection[Any]],  # noqa: F811
) -> None:
    """1,000,000 finished events over five days of history (200,000 keys, each finished once a day),
    with their timeline entries: the event of a key (the latest), a key's events by id (the
    dashboard's key page) and the retry of a dead event read history through its (queue,
    schedule_on, id) index, never by a scan of a day that holds rows, and touch a few dozen
    buffers per event (a few per day), un-analysed (just filled), then analysed."""
    store, raw = fresh_install
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    for start in range(0, 20_000, 5_000):  # open events too: the reads look there first, by primary key
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"open{i}", data={}, delay_seconds=3600) for i in range(start, start + 5_000)],
            actor="load",
        )
    today = raw.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC')").fetchone()[0]  # type: ignore[index]
    first_day = today.replace(tzinfo=UTC) + timedelta(days=1)  # days ahead (a fresh install's past is one partition)
    for n in range(DAYS):
        day = (first_day + timedelta(days=n)).date()
        for parent in ("tickler_event_history", "tickler_timeline"):
            raw.execute("SELECT tickler_add_history_day(%s, %s)", [parent, day])
            for (part,) in raw.execute(
                "SELECT name FROM tickler_history_partition WHERE day_table = %s", [f"{parent}_{day:%Y%m%d}"]
            ).fetchall():  # the day's parts (migration 0074): the queue's, and `_rest`
                raw.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = off)")
    for start in range(0, EVENTS, 250_000):
        raw.execute(
            FILL, {"offset": OFFSET, "keys": KEYS, "start": start, "stop": start + 249_999, "first_day": first_day}
        )
    assert len(populated(raw)) >= 1 + 2 * DAYS

    ids = [OFFSET + 7 + n * KEYS for n in range(DAYS)]  # key k7's events, one a day
    dead = next(g for g in range((DAYS - 1) * KEYS, EVENTS) if g % 97 == 0)  # the last day's first dead event
    dead_key = f"k{dead % KEYS}"  # its newest event is that dead one
    reads = {
        "get_latest_event": {"queue": "emails", "item_key": "k7", "now": None},
        "get_events_by_id": {"queue": "emails", "item_key": "k7", "ids": ids, "now": None},
        "retry_event": {
            "queue": "emails",
            "item_key": dead_key,
            "schedule_on": None,
            "delay_seconds": None,
            "actor": "ops",
            "now": None,
        },
    }
    for analysed in (False, True):
        if analysed:
            raw.execute("ANALYZE tickler_event, tickler_event_history, tickler_timeline")
        for name, params in reads.items():
            text = plan(raw, name, params)
            assert not scanned(text) & populated(raw), (analysed, name, text)
            days = history_scans(text, {t for t in populated(raw) if t.startswith("tickler_event_history")})
            # each probe bound to the event (queue, schedule_on and id in the day's index condition), or
            # to the key's dead events (the retry's candidates, tickler_event_history_dead)
            assert days and all(
                ("_queue_schedule_on_id_idx" in s and "id = " in s) or "item_key = " in s for s in days
            ), (
                analysed,
                name,
                days,
            )
        for name in ("get_latest_event", "get_events_by_id"):
            # history and timeline only: un-analysed, the open event of a key may be looked up on
            # tickler_event_open_schedule (the queue's open events), as before 0063
            touched = buffers(raw, name, reads[name], populated(raw) - {"tickler_event"})
            events = len(reads[name].get("ids", [1]))
            assert touched < 60 * events, (analysed, name, touched)  # a few pages per day and event

    latest = store.events.get("emails", "k7")
    assert latest.id == ids[-1] and latest.status == "delivered"
    found = store.events.get_many("emails", "k7", [*ids, 12345678])
    assert [e.id for e in found] == ids
    assert {e.dequeued_on.date() for e in found if e.dequeued_on} == {  # type: ignore[union-attr]
        (first_day + timedelta(days=n)).date() for n in range(DAYS)
    }
    assert store.events.get_many("emails", "k8", ids) == []  # not k8's events
    retried = EventOperations(store.events.engine).retry("emails", dead_key, actor="ops")
    assert retried.id == OFFSET + dead and retried.status == "pending"
    assert raw.execute("SELECT count(*) FROM tickler_event_history WHERE id = %s", [retried.id]).fetchone() == (0,)
