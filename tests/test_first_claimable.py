"""The readers of claim order that do not claim (migration 0071): when the next ungrouped event
falls due (the dispatcher's sleep, `next_due`), whether any is due (`has_due_events`), and the
dashboard's fair backlogs read the priority index a level at a time, since the index of due time
alone is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import Store
from tickler.scheduler.store.ui_reads import UIReads

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def schedule(store: Store, queue: Queue, key: str, seconds: float, **fields: Any) -> None:
    store.events.schedule_batch(queue, [NewEvent(item_key=key, data={}, schedule_on=at(seconds), **fields)], actor="t")


def first_claimable(engine: sa.Engine, queue: str) -> datetime | None:
    with engine.connect() as conn:
        found: datetime | None = conn.execute(sa.text("SELECT tickler_first_claimable(:q)"), {"q": queue}).scalar()
    return found


def test_the_first_claimable_event_is_the_earliest_unleased_ungrouped_one_at_any_priority(
    store: Store, engine: sa.Engine, make_queue: Any
) -> None:
    queue = make_queue("emails")
    other = make_queue("other")
    assert first_claimable(engine, "emails") is None
    schedule(store, queue, "leased", -60)  # priority 0, claimed below
    schedule(store, queue, "p0", -5)
    schedule(store, queue, "low", -10, priority=-3)
    schedule(store, queue, "high-later", 3600, priority=5)
    [lease] = store.leases.claim(queue, worker="w", limit=1, now=NOW)
    assert [event.item_key for event in lease.events] == ["leased"]
    schedule(store, queue, "grouped", -120, group_key="g")
    schedule(store, other, "elsewhere", -300)

    assert first_claimable(engine, "emails") == at(-10)  # not the leased, grouped or other queue's
    [row] = driver_rows(engine, driver_sql("next_due"), {"queues": ["emails"]})
    assert row["next_on"] == at(-120)  # the grouped one: its group holds no lease

    def has_due(queue: str, now: datetime) -> Any:
        [[due]] = driver_rows(engine, driver_sql("has_due_events"), {"queue": queue, "now": now}, tuples=True)
        return due

    assert has_due("emails", NOW) is True
    assert has_due("emails", at(-11)) is False
    assert has_due("nothing-here", NOW) is False


def test_the_first_claimable_event_is_found_by_probes_not_a_scan(
    store: Store, make_queue: Any, raw: psycopg.Connection[Any]
) -> None:
    """20,000 future events at priority 0 and 5,000 at 7 ahead of the one due event at -2: a few
    pages read, where a scan of the open events reads hundreds."""
    queue = make_queue("emails")
    for start in range(0, 20_000, 5_000):
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"k{i}", data={}, schedule_on=at(60 + i)) for i in range(start, start + 5_000)],
            actor="t",
        )
    store.events.schedule_batch(
        queue,
        [NewEvent(item_key=f"h{i}", data={}, schedule_on=at(30 + i), priority=7) for i in range(5_000)],
        actor="t",
    )
    schedule(store, queue, "due", -1, priority=-2)
    raw.execute("ANALYZE tickler_event")
    raw.execute("SELECT tickler_first_claimable('emails')")  # planned (the catalogs read once)
    row = raw.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT tickler_first_claimable('emails')").fetchone()
    assert row is not None
    top = row[0][0]["Plan"]
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 60, top
    found = raw.execute("SELECT tickler_first_claimable('emails')").fetchone()
    assert found is not None and found[0] == at(-1)
    assert raw.execute("SELECT to_regclass('tickler_event_claimable')").fetchone() == (None,)


def test_fair_backlogs_look_at_the_head_of_the_queue_in_claim_order(
    store: Store, engine: sa.Engine, make_queue: Any
) -> None:
    """Higher priority first, whatever the due times: with room for 3 events, the two of the
    priority-5 key come before the five earlier ones at priority 0."""
    queue = make_queue("emails", fair_share=True)
    for i in range(5):
        schedule(store, queue, f"b{i}", -100 + i, fairness_key="bulk")
    for i in range(2):
        schedule(store, queue, f"a{i}", -10 + i, fairness_key="vip", priority=5)
    schedule(store, queue, "later", 60, fairness_key="vip", priority=9)  # not due: not seen
    backlogs = UIReads(engine).fair_backlogs("emails", scan=3, now=NOW)
    assert backlogs.keys == [("vip", 2), ("bulk", 1)]
    assert backlogs.seen == 3 and backlogs.more
    everything = UIReads(engine).fair_backlogs("emails", now=NOW)
    assert everything.keys == [("bulk", 5), ("vip", 2)] and everything.seen == 7 and not everything.more
