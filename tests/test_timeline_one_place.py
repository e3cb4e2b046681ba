"""The timeline written in one place (issue #21, migration 0061): tickler_timeline_write() is the
only statement that inserts into tickler_timeline, and every state change leaves exactly its
entries (action, actor, details) and nothing else."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import pg
from tests.previous_schedule import schedule_as_earlier_releases
from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.store.events import EventChanges
from tickler.scheduler.store.schedules import ScheduleSpec
from tickler.scheduler.store.search import Matching

ROOT = Path(__file__).resolve().parent.parent
INSERT = re.compile(r"insert\s+into\s+(?:public\.)?tickler_timeline\b", re.IGNORECASE)

Row = tuple[str, str, str, dict[str, Any]]  # item_key, action, actor, details


def db_now(raw: psycopg.Connection[Any]) -> Any:
    return raw.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


def stored(raw: psycopg.Connection[Any]) -> str:
    """The timeline's rows: tickler_timeline_all since migration 0072 (a delivery's row is its
    history row), the table before it."""
    found = raw.execute("SELECT to_regclass('tickler_timeline_all') IS NOT NULL").fetchone()
    return "tickler_timeline_all" if found and found[0] else "tickler_timeline"


def last_id(raw: psycopg.Connection[Any]) -> int:
    return int(raw.execute(f"SELECT coalesce(max(id), 0) FROM {stored(raw)}").fetchone()[0])  # type: ignore[index]


def written(raw: psycopg.Connection[Any], step: Callable[[], object]) -> list[Row]:
    """The timeline rows that `step` wrote, in the order of their ids."""
    since = last_id(raw)
    step()
    found = raw.execute(
        f"SELECT item_key, action, actor, details FROM {stored(raw)} WHERE id > %s ORDER BY id", [since]
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in found]


def expect(rows: list[Row], wanted: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    """Exactly these entries: key, action and actor equal, and the details hold these values."""
    assert [(k, a, who) for k, a, who, _ in rows] == [(k, a, who) for k, a, who, _ in wanted], rows
    for (_, _, _, details), (_, _, _, subset) in zip(rows, wanted, strict=True):
        assert {name: details.get(name) for name in subset} == subset, details


def test_enqueue_replace_debounce_change_and_cancel_each_leave_their_entry(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_writes", max_attempts=3)
    enqueued = written(raw, lambda: store.events.schedule_batch(queue, [NewEvent("a", {"v": 1})], actor="app"))
    expect(enqueued, [("a", "enqueued", "app", {"max_attempts": 3})])
    assert enqueued[0][3] == {"max_attempts": 3}

    single = written(raw, lambda: store.events.schedule(queue, NewEvent("b", {}, priority=2), actor="app"))
    expect(single, [("b", "enqueued", "app", {"max_attempts": 3, "priority": 2})])

    replaced = written(
        raw,
        lambda: store.events.schedule_batch(queue, [NewEvent("a", {"v": 2})], actor="app", on_conflict="replace"),
    )
    expect(replaced, [("a", "replaced", "app", {"max_attempts": 3})])
    assert replaced[0][3] == {"max_attempts": 3}

    debounced = written(
        raw,
        lambda: store.events.schedule_batch(
            queue, [NewEvent("a", {"v": 3}, delay_seconds=60)], actor="app", on_conflict="debounce"
        ),
    )
    expect(debounced, [("a", "debounced", "app", {"max_attempts": 3})])
    assert set(debounced[0][3]) == {"max_attempts", "previous_schedule_on"}

    ignored = written(
        raw, lambda: store.events.schedule_batch(queue, [NewEvent("a", {})], actor="app", on_conflict="ignore")
    )
    assert ignored == []

    rescheduled = written(
        raw, lambda: store.events.change("one_place_writes", "a", EventChanges(delay_seconds=5), actor="ops")
    )
    expect(rescheduled, [("a", "rescheduled", "ops", {"changed": ["schedule_on"]})])
    assert set(rescheduled[0][3]) == {"changed", "previous_schedule_on"}

    updated = written(
        raw, lambda: store.events.change("one_place_writes", "a", EventChanges(data={"v": 4}), actor="ops")
    )
    expect(updated, [("a", "updated", "ops", {"changed": ["data"]})])
    assert updated[0][3] == {"changed": ["data"]}

    unchanged = written(
        raw, lambda: store.events.change("one_place_writes", "a", EventChanges(data={"v": 4}), actor="ops")
    )
    assert unchanged == []

    cancelled = written(raw, lambda: store.events.cancel("one_place_writes", "a", actor="ops", reason="no longer"))
    expect(cancelled, [("a", "cancelled", "ops", {"reason": "no longer"})])
    assert cancelled[0][3] == {"reason": "no longer"}


def test_a_delivery_attempt_leaves_one_entry_when_it_ends(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_attempts", max_attempts=3, lease_seconds=30)
    written(raw, lambda: store.events.schedule_batch(queue, [NewEvent("k", {})], actor="app"))
    now = db_now(raw)

    leases: list[Any] = []
    claimed = written(raw, lambda: leases.extend(store.leases.claim(queue, worker="w1", limit=1, now=now)))
    assert claimed == []  # the claim writes no row: its `claimed` entry is read from the event (0016)
    [lease] = leases
    assert [e.action for e in store.events.timeline("one_place_attempts", "k")] == ["enqueued", "claimed"]

    failed = written(
        raw,
        lambda: store.leases.nack(lease.lease_id, error="HTTP 500", retry_in_seconds=0, now=now + timedelta(seconds=1)),
    )
    expect(failed, [("k", "failed", "w1", {"lease_id": lease.lease_id, "attempt": 1, "error": "HTTP 500"})])
    assert set(failed[0][3]) == {"lease_id", "attempt", "error", "retry_at", "claim"}

    later = now + timedelta(seconds=2)
    [lease] = store.leases.claim(queue, worker="w2", limit=1, now=later)
    released = written(raw, lambda: store.leases.release([lease.lease_id], actor="w-stopping", now=later))
    expect(released, [("k", "released", "w-stopping", {})])
    assert set(released[0][3]) == {"claim"}

    [lease] = store.leases.claim(queue, worker="w3", limit=1, now=later)
    delivered = written(raw, lambda: store.leases.ack([lease.lease_id], now=later + timedelta(seconds=1)))
    expect(delivered, [("k", "delivered", "w3", {"lease_id": lease.lease_id, "attempt": 2})])
    assert set(delivered[0][3]) == {"lease_id", "attempt", "claim"}


def test_dead_and_retried_leave_their_entries(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_dead", max_attempts=3, lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent("d1", {}), NewEvent("d2", {}), NewEvent("d3", {})], actor="app")
    now = db_now(raw)
    leases = store.leases.claim(queue, worker="w1", limit=3, now=now)
    assert len(leases) == 3
    for lease in leases:
        dead = written(raw, lambda lease=lease: store.leases.nack(lease.lease_id, error="HTTP 410", dead=True, now=now))
        assert len(dead) == 1
        expect(dead, [(dead[0][0], "dead", "w1", {"reason": "receiver said stop", "attempt": 1, "error": "HTTP 410"})])

    retried = written(raw, lambda: store.events.retry("one_place_dead", "d1", actor="ops"))
    expect(retried, [("d1", "retried", "ops", {})])
    assert "bulk" not in retried[0][3]

    bulk = written(
        raw, lambda: store.events.retry_matching("one_place_dead", Matching(item_key_prefix="d"), actor="ops")
    )
    expect(bulk, [("d2", "retried", "ops", {"bulk": True}), ("d3", "retried", "ops", {"bulk": True})])


def test_the_reaper_ends_an_expired_lease_with_its_entries(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_reaper", max_attempts=2, lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent("r", {})], actor="app")
    now = db_now(raw)
    [lease] = store.leases.claim(queue, worker="w1", limit=1, now=now)
    expired = written(raw, lambda: store.leases.expire(queue="one_place_reaper", now=now + timedelta(seconds=31)))
    expect(expired, [("r", "lease_expired", "tickler", {"lease_id": lease.lease_id})])

    [lease] = store.leases.claim(queue, worker="w2", limit=1, now=now + timedelta(seconds=32))
    died = written(raw, lambda: store.leases.expire(queue="one_place_reaper", now=now + timedelta(seconds=63)))
    expect(
        died,
        [
            ("r", "lease_expired", "tickler", {"lease_id": lease.lease_id}),
            ("r", "dead", "tickler", {"reason": "attempts exhausted", "attempts": 2}),
        ],
    )
    assert died[1][3] == {"reason": "attempts exhausted", "attempts": 2}


@pytest.mark.parametrize(
    "settings",
    [{}, {"fair_share": True}, {"fair_share": True, "max_in_flight_per_key": 5}, "grouped"],
    ids=["plain", "round robin", "fair with a cap", "group claim"],
)
def test_a_claim_that_meets_an_expired_lease_leaves_its_lease_expired_entry(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], settings: Any
) -> None:
    grouped = settings == "grouped"
    queue = make_queue("one_place_claims", max_attempts=3, lease_seconds=30, **({} if grouped else settings))
    store.events.schedule_batch(queue, [NewEvent("c", {}, group_key="g" if grouped else None)], actor="app")
    now = db_now(raw)
    [lease] = store.leases.claim(queue, worker="w1", limit=1, now=now)
    reclaimed = written(raw, lambda: store.leases.claim(queue, worker="w2", limit=1, now=now + timedelta(seconds=31)))
    expect(reclaimed, [("c", "lease_expired", "tickler", {"lease_id": lease.lease_id})])


def test_a_change_that_meets_an_expired_lease_ends_it_first(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_changes", max_attempts=3, lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent("x", {}), NewEvent("y", {})], actor="app")
    now = db_now(raw)
    leases = store.leases.claim(queue, worker="w1", limit=2, now=now)
    assert len(leases) == 2
    later = now + timedelta(seconds=31)

    replaced = written(
        raw,
        lambda: store.events.schedule_batch(
            queue, [NewEvent("x", {"v": 2})], actor="app", on_conflict="replace", now=later
        ),
    )
    expect(replaced, [("x", "lease_expired", "tickler", {}), ("x", "replaced", "app", {"max_attempts": 3})])

    cancelled = written(raw, lambda: store.events.cancel("one_place_changes", "y", actor="ops", now=later))
    expect(cancelled, [("y", "lease_expired", "tickler", {}), ("y", "cancelled", "ops", {})])
    assert cancelled[1][3] == {}


def test_cancel_matching_leaves_one_entry_per_event_and_ends_expired_leases(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_bulk", max_attempts=3, lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent("p1", {})], actor="app")
    now = db_now(raw)
    [lease] = store.leases.claim(queue, worker="w1", limit=1, now=now)
    store.events.schedule_batch(queue, [NewEvent("p2", {}), NewEvent("q", {})], actor="app")
    cancelled = written(
        raw,
        lambda: store.events.cancel_matching(
            "one_place_bulk", Matching(item_key_prefix="p"), actor="ops", reason="bulk", now=now + timedelta(seconds=31)
        ),
    )
    expect(
        cancelled,
        [
            ("p1", "lease_expired", "tickler", {"lease_id": lease.lease_id}),
            ("p1", "cancelled", "ops", {"reason": "bulk", "bulk": True}),
            ("p2", "cancelled", "ops", {"reason": "bulk", "bulk": True}),
        ],
    )
    assert cancelled[2][3] == {"reason": "bulk", "bulk": True}


def test_schedule_changes_and_a_queue_deletion_leave_their_entries(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("one_place_schedules", max_attempts=3, lease_seconds=30)
    spec = ScheduleSpec(cron="0 * * * *", timezone="UTC", data={})
    created = written(raw, lambda: store.schedules.put("one_place_schedules", "hourly", spec, actor="ops"))
    assert [(k, a, who) for k, a, who, _ in created if a.startswith("schedule_")] == [
        ("hourly", "schedule_created", "ops")
    ]
    assert [a for _, a, _, _ in created if not a.startswith("schedule_")] == ["enqueued"]  # its next occurrence

    changed = ScheduleSpec(cron="30 * * * *", timezone="UTC", data={})
    updated = written(raw, lambda: store.schedules.put("one_place_schedules", "hourly", changed, actor="ops"))
    schedule_rows = [(k, a, who, d) for k, a, who, d in updated if a.startswith("schedule_")]
    expect(schedule_rows, [("hourly", "schedule_updated", "ops", {"cron": "30 * * * *"})])
    # the waiting occurrence of the old cron is cancelled, the new one enqueued
    assert [a for _, a, _, _ in updated if not a.startswith("schedule_")] == ["cancelled", "enqueued"]

    deleted = written(raw, lambda: store.schedules.delete("one_place_schedules", "hourly", actor="ops"))
    schedule_rows = [(k, a, who, d) for k, a, who, d in deleted if a.startswith("schedule_")]
    expect(schedule_rows, [("hourly", "schedule_deleted", "ops", {"cron": "30 * * * *"})])

    store.schedules.put(
        "one_place_schedules", "daily", ScheduleSpec(cron="0 6 * * *", timezone="UTC", data={}), actor="ops"
    )
    store.events.schedule_batch(queue, [NewEvent("open", {}), NewEvent("leased", {})], actor="app")
    now = db_now(raw)
    leases = store.leases.claim(queue, worker="w1", limit=3, now=now)
    assert leases
    open_events = raw.execute(
        "SELECT item_key, lease_id IS NOT NULL FROM tickler_event WHERE queue = 'one_place_schedules' ORDER BY id"
    ).fetchall()
    gone = written(raw, lambda: store.queues.delete("one_place_schedules", actor="ops", cancel_open=True))
    events = [row for row in gone if not row[1].startswith("schedule_")]
    expect(
        events,
        [(key, "cancelled", "ops", {"reason": "queue deleted"}) for key, _ in open_events],
    )
    for (_, leased), (_, _, _, details) in zip(open_events, events, strict=True):
        assert ("claim" in details) is leased
    expect(
        [row for row in gone if row[1].startswith("schedule_")],
        [("daily", "schedule_deleted", "ops", {"reason": "queue deleted", "cron": "0 6 * * *"})],
    )


def test_an_upgrade_keeps_the_timeline_and_its_writers_write_on(
    admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries written before migration 0061 (by the previous functions) stay as they were; after
    it, the same changes write the same entries through tickler_timeline_write()."""
    schedule_as_earlier_releases(monkeypatch)  # before the upgrade, its tickler_schedule()
    url = pg.create_database(admin_url, prefix="tickler_upgrade_timeline")
    migrate(url, through=60)
    engine = create_engine(url, pool_size=2)
    try:
        store = Store(engine)
        with psycopg.connect(libpq_url(url), autocommit=True) as raw:
            # created as that release did (this one's also writes the operations log, 0076)
            raw.execute(
                "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
                " backoff_max_seconds, backoff_multiplier) VALUES ('emails', 'pull', 30, 2, 1, 60, 2)"
            )
            queue = store.queues.get("emails")
            enqueued = written(raw, lambda: store.events.schedule_batch(queue, [NewEvent("k", {"v": 1})], actor="app"))
            expect(enqueued, [("k", "enqueued", "app", {"max_attempts": 2})])
            before = raw.execute("SELECT * FROM tickler_timeline ORDER BY id").fetchall()

            assert 61 in [getattr(step, "version", None) for step in migrate(url)]
            assert raw.execute("SELECT * FROM tickler_timeline ORDER BY id").fetchall() == before

            now = db_now(raw)
            [lease] = store.leases.claim(queue, worker="w1", limit=1, now=now)
            expired = written(raw, lambda: store.leases.expire(now=now + timedelta(seconds=31)))
            expect(expired, [("k", "lease_expired", "tickler", {"lease_id": lease.lease_id})])
            replaced = written(
                raw,
                lambda: store.events.schedule_batch(
                    queue, [NewEvent("k", {"v": 2})], actor="app", on_conflict="replace"
                ),
            )
            expect(replaced, [("k", "replaced", "app", {"max_attempts": 2})])
            assert replaced[0][3] == enqueued[0][3]
            timeline = store.events.timeline("emails", "k")
            assert [e.action for e in timeline] == ["enqueued", "claimed", "lease_expired", "replaced"]
    finally:
        engine.dispose()
        pg.drop_database(admin_url, url)


# -- the one place ---------------------------------------------------------------------------------


def test_no_statement_of_the_code_inserts_into_the_timeline() -> None:
    """Only tickler_timeline_write() (scheduler/database/history.sql) inserts: no statement of the
    application does (the database's functions are checked below, in the migrated database)."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tickler").rglob("*"))
        if path.suffix in (".sql", ".py")
        and path.is_file()
        and not path.is_relative_to(ROOT / "tickler" / "scheduler" / "database")
        and not path.is_relative_to(ROOT / "tickler" / "migrations")
        and INSERT.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_only_the_one_function_of_the_migrated_database_inserts_into_the_timeline(
    raw: psycopg.Connection[Any],
) -> None:
    """The latest definition of every function (pg_proc): only tickler_timeline_write's body inserts."""
    bodies = raw.execute(
        "SELECT p.proname, p.prosrc FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE n.nspname = current_schema()"
    ).fetchall()
    assert len(bodies) > 20  # the functions of the migrations are there
    inserting = sorted(name for name, body in bodies if INSERT.search(body or ""))
    # tickler_timeline_keep_entries (0072) writes no new entry: before a deleted queue's history
    # rows go, it moves the delivered entries that are those rows into the table, ids kept.
    assert inserting == ["tickler_timeline_keep_entries", "tickler_timeline_write"]
    callers = sorted(name for name, body in bodies if "tickler_timeline_write(" in (body or ""))
    # the write path's general step, the claim (its `lease_expired` entries), a change and a cancel
    # by key, and an erasure (the `erased` entry that ends each erased key's timeline)
    assert callers == [
        "tickler_cancel_event",
        "tickler_change_event",
        "tickler_claim_events",
        "tickler_end_expired_leases",
        "tickler_erase_batch",
        "tickler_erasure_finish",
        "tickler_schedule_events",
    ]
