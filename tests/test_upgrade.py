"""The upgrade to history by day (migration 0021): a database built with the previous schema
(migrations 0001 to 0020), filled with every kind of event, is upgraded while a worker delivers,
and everything a client can read is the same before and after."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests import pg
from tests.helpers_wait import wait_until
from tests.helpers_worker import recording_worker
from tests.previous_ack import ack_before_0072
from tests.previous_schedule import schedule_as_earlier_releases
from tickler.config import Settings
from tickler.scheduler import recurring
from tickler.scheduler.db import libpq_url
from tickler.scheduler.errors import StaleLease
from tickler.scheduler.migrate import Migration, Step, available_migrations, migrate
from tickler.scheduler.models import Event, NewEvent, Queue
from tickler.scheduler.sql import parse_queries
from tickler.scheduler.store import QueueSettings, SearchFilter, Store
from tickler.scheduler.store.operations import EventOperations

PREVIOUS = 20  # the last migration of the release before history by day

# The previous release's ack (its ack_leases): the finish as an UPDATE of the event row. Its
# workers keep running it while the upgrade runs, and after it (the move trigger takes such
# finished rows into the history); this release deletes and moves the row in one statement.
PREVIOUS_ACK = """
WITH clock AS (SELECT now() AS now),
finished AS (
    UPDATE tickler_event AS e
    SET dequeued_on = clock.now, dequeued_by = e.claimed_by, outcome = 'delivered', version = e.version + 1
    FROM clock
    WHERE e.lease_id = ANY(%(lease_ids)s::uuid[]) AND e.dequeued_on IS NULL AND e.lease_expires_on > clock.now
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, dequeued_on, 'delivered', dequeued_by, schedule_on,
           tickler_with_claim(jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1),
                              dequeued_on, dequeued_by, schedule_on, claimed_on, claimed_by, claimed_expires_on,
                              lease_id, redeliver_count + 1, group_key, schedule_on)
    FROM finished
)
SELECT id FROM finished
"""


# The previous release's claims (tests/previous_claims.sql): this release's claims read columns
# that the previous schema does not have (priority, fairness_key: migration 0045).
PREVIOUS_CLAIMS = {
    name: sa.text(sql)
    for name, sql in parse_queries((Path(__file__).parent / "previous_claims.sql").read_text()).items()
}


def numbered(steps: list[Step]) -> list[int]:
    """The numbered migrations among the steps a run applied (the code files come after them)."""
    return [step.version for step in steps if isinstance(step, Migration)]


def previous_claim(
    engine: sa.Engine, queue: Queue, *, worker: str, limit: int, now: datetime | None = None, groups: bool = False
) -> list[str]:
    """Lease ids claimed by the previous release's statements (ungrouped, or one lease per group)."""
    params = {
        "queue": queue.name,
        "worker": worker,
        "limit": limit,
        "lease_seconds": queue.lease_seconds,
        "now": now,
        "flow": False,
    }
    with engine.begin() as conn:
        if groups:
            chosen = conn.execute(PREVIOUS_CLAIMS["lock_due_groups"], {**params, "scan": limit * 50}).all()
            claimed = conn.execute(PREVIOUS_CLAIMS["claim_groups"], {**params, "groups": [r[0] for r in chosen]})
        else:
            claimed = conn.execute(PREVIOUS_CLAIMS["claim_events"], params)
        lease_ids = [row["lease_id"] for row in claimed.mappings() if row["lease_id"] is not None]
    return list(dict.fromkeys(str(lease_id) for lease_id in lease_ids))


def previous_nack(engine: sa.Engine, lease_id: str, *, error: str, now: datetime, dead: bool = False) -> None:
    """The previous release's nack (its fail_lease): this release's reads the lease table."""
    params = {"lease_id": lease_id, "error": error, "retry_in_seconds": None, "dead": dead, "now": now}
    with engine.begin() as conn:
        assert conn.execute(PREVIOUS_CLAIMS["fail_lease"], {**params, "trace_id": None}).all()


def previous_cancel(engine: sa.Engine, queue: str, item_key: str, *, actor: str, now: datetime | None = None) -> None:
    """An earlier release's cancel of an open, unleased event (its own timeline insert): this
    release's cancel is tickler_cancel_event(), a code file's function that an earlier release's
    database does not have until it is migrated."""
    with engine.begin() as conn:
        event_id = conn.execute(
            sa.text(
                "SELECT id FROM tickler_event WHERE queue = :queue AND item_key = :key AND dequeued_on IS NULL"
                " FOR UPDATE"
            ),
            {"queue": queue, "key": item_key},
        ).scalar_one()
        params = {"id": event_id, "actor": actor, "reason": None, "now": now}
        assert conn.execute(PREVIOUS_CLAIMS["cancel_event"], params).all()


@pytest.fixture(autouse=True)
def previous_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule_as_earlier_releases(monkeypatch)


def previous_ack(url: str, lease_ids: list[str]) -> list[int]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        return [row[0] for row in conn.execute(PREVIOUS_ACK, {"lease_ids": lease_ids})]


@pytest.fixture
def previous_release(admin_url: str) -> Iterator[tuple[str, Store, psycopg.Connection[Any]]]:
    """A database of its own with the schema of the previous release."""
    with pg.migrated_database(admin_url, "tickler_upgrade", through=PREVIOUS) as (url, engine, raw):
        yield url, Store(engine), raw


def fill(url: str, store: Store, engine: sa.Engine, now: datetime) -> list[tuple[str, str]]:
    """Every kind of event the previous release held, written by the statements that release ran
    (the write path is unchanged): open, due, in flight, delivered, cancelled, dead, grouped,
    debounced, a reused key, recurring occurrences. Returns the (queue, key) pairs written."""
    return _fill(url, store, engine, now)


def _fill(url: str, store: Store, engine: sa.Engine, now: datetime) -> list[tuple[str, str]]:
    queue = add_queue(engine, store, "emails", max_attempts=2)
    grouped = add_queue(engine, store, "digests")
    past = now - timedelta(hours=2)
    store.events.schedule_batch(
        queue,
        [NewEvent(item_key=f"due{i}", data={"i": i}, schedule_on=past) for i in range(6)]
        + [NewEvent(item_key=f"later{i}", data={}, schedule_on=now + timedelta(days=2)) for i in range(3)],
        actor="app",
        now=past,
    )
    leases = previous_claim(engine, queue, worker="w", limit=4, now=past + timedelta(minutes=1))
    previous_ack(url, [leases[0]])  # delivered
    previous_nack(engine, leases[1], error="boom", dead=True, now=past + timedelta(minutes=2))  # dead
    previous_nack(engine, leases[2], error="later", now=past + timedelta(minutes=2))  # retried later
    # leases[3] stays in flight (a lease of a day: the worker of the upgrade does not reap it)
    previous_cancel(engine, "emails", "later0", actor="app", now=past + timedelta(minutes=3))
    # a reused key: delivered, then scheduled again
    store.events.schedule(queue, NewEvent(item_key="due0", data={"again": True}), actor="app", now=past)
    # debounced: the latest data wins
    for n in range(3):
        store.events.schedule(
            queue,
            NewEvent(item_key="digest", data={"n": n}, delay_seconds=600),
            actor="app",
            on_conflict="debounce",
            now=past + timedelta(seconds=n),
        )
    # grouped: one lease for a group's due events, acked
    store.events.schedule_batch(
        grouped,
        [NewEvent(item_key=f"g{i}", data={}, group_key="ana", schedule_on=past) for i in range(3)]
        + [NewEvent(item_key="g-other", data={}, group_key="bob", schedule_on=past)],
        actor="app",
        now=past,
    )
    group_leases = previous_claim(engine, grouped, worker="w", limit=1, groups=True, now=past + timedelta(minutes=1))
    previous_ack(url, [group_leases[0]])
    # recurring: a schedule and its occurrences
    # (as the previous release wrote it: its schedules had no priority; the entry PUT would log)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO tickler_schedule (queue, schedule_key, cron, timezone, created_on, created_by, updated_on,"
                " updated_by) VALUES ('digests', 'nightly', '0 * * * *', 'UTC', :past, 'ops', :past, 'ops')"
            ),
            {"past": past},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tickler_timeline (queue, item_key, at, action, actor, details)"
                " VALUES ('digests', 'nightly', :past, 'schedule_created', 'ops', '{}')"
            ),
            {"past": past},
        )
    recurring.enqueue_due(engine, now=now)
    with engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT DISTINCT queue, item_key FROM tickler_timeline ORDER BY 1, 2")).all()
    return [(row.queue, row.item_key) for row in keys]


def add_queue(engine: sa.Engine, store: Store, name: str, max_attempts: int = 10) -> Queue:
    """A pull queue, created as the previous release did (it had no history settings)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
                " backoff_max_seconds, backoff_multiplier) VALUES (:name, 'pull', 86400, :max_attempts, 1, 60, 2)"
            ),
            {"name": name, "max_attempts": max_attempts},
        )
    return store.queues.get(name)


# Columns a later migration adds to rows that were written before it, NULL in those rows or
# filled by the migration (they are left out where rows or events are compared across an upgrade).
ADDED_LATER = {
    "entry_id",  # migration 0072, NULL in every row written before it
    "changed_on",  # migration 0079: open events' from their timeline (tests/test_upgrade_this_release.py)
}


def without_added(event: Event) -> Event:
    """An event as both schemas read it (read before 0079, changed_on falls back to enqueued_on)."""
    return dataclasses.replace(event, changed_on=None)


def rows(raw: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    cursor = raw.execute(f"SELECT * FROM {table} ORDER BY id")
    kept = [i for i, column in enumerate(cursor.description or []) if column.name not in ADDED_LATER]
    return [tuple(row[i] for i in kept) for row in cursor.fetchall()]


def readable(store: Store, keys: list[tuple[str, str]], now: datetime) -> dict[str, Any]:
    """What a client reads that both schemas answer through the same statements."""
    return {
        "timelines": {key: store.events.timeline(*key) for key in keys},
        "counts": {queue: store.queues.counts(queue, now=now) for queue in ("emails", "digests")},
        "gauges": store.queues.gauges(None, now=now),
    }


def test_upgrade_keeps_every_event_and_timeline_entry_while_a_worker_delivers(
    previous_release: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    url, store, raw = previous_release
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=5)
    keys = fill(url, store, store.engine, now)
    before_rows = rows(raw, "tickler_event")
    before_timeline = raw.execute("SELECT * FROM tickler_timeline ORDER BY id").fetchall()
    before = readable(store, keys, now)
    assert {row[10] for row in before_rows} == {None, "delivered", "cancelled", "dead"}  # outcome

    # A worker of the previous release delivers a queue of its own through the upgrade.
    busy = add_queue(store.engine, store, "busy")
    store.events.schedule_batch(
        busy,
        [NewEvent(item_key=f"b{i}", data={}, delay_seconds=i * 0.01) for i in range(300)],
        actor="app",
    )
    delivered: list[int] = []
    errors: list[BaseException] = []
    failures: list[BaseException] = []  # a statement the upgrade made fail (a deadlock), retried

    def previous_worker() -> None:
        # As a worker does, it claims again on its next round when a claim fails, and acks again
        # what it could not ack (its leases last a day).
        unacked: list[str] = []
        try:
            while len(delivered) < 300:
                try:
                    unacked += previous_claim(store.engine, busy, worker="previous", limit=10)
                    delivered.extend(previous_ack(url, unacked))
                    unacked = []
                except (sa.exc.OperationalError, psycopg.OperationalError) as error:
                    failures.append(error)
        except BaseException as error:  # reported below
            errors.append(error)

    worker = threading.Thread(target=previous_worker)
    worker.start()
    wait_until(lambda: len(delivered) >= 20 or errors, what="the worker delivering before the upgrade")
    # the storage upgrade (0021) alone while the previous release's worker runs; the later ones
    # (0045 adds columns to the event rows, which a running worker's prepared `e.*` statements
    # would refuse: "cached plan must not change result type") once it has stopped, below
    applied = migrate(url, through=21)
    assert numbered(applied) == [21]
    worker.join(timeout=60)
    assert not errors and not worker.is_alive()
    migrate(url)  # the later releases' migrations, before their workers start
    busy_rows = raw.execute(
        "SELECT item_key, outcome FROM tickler_event_history WHERE queue = 'busy' ORDER BY item_key"
    ).fetchall()
    assert len(busy_rows) == 300 and {outcome for _, outcome in busy_rows} == {"delivered"}
    assert sorted(delivered) == sorted(set(delivered))  # each delivered once
    assert one_value(raw, "SELECT count(*) FROM tickler_event WHERE queue = 'busy'") == 0
    # and this release's worker takes over, once the later migrations are applied too (they only
    # add: columns at the end of the event rows, compared below without them)
    migrate(url)
    store.events.schedule(busy, NewEvent(item_key="after", data={}), actor="app")
    with recording_worker(url, "busy", lambda event: None, name="upgraded") as handled:
        wait_until(lambda: one_value(raw, "SELECT count(*) FROM tickler_event WHERE queue = 'busy'") == 0)
    assert len(handled) == 1
    # The next due time of each queue (the dispatcher's sleep) from the priority index alone
    # (0071 dropped the index of due time), the same as read from the upgraded rows.
    assert one_value(raw, "SELECT to_regclass('tickler_event_claimable') IS NULL") is True
    firsts = []
    for (name,) in raw.execute("SELECT name FROM tickler_queue").fetchall():
        direct = raw.execute(
            "SELECT min(schedule_on) FROM tickler_event WHERE queue = %s AND dequeued_on IS NULL"
            " AND lease_id IS NULL AND group_key IS NULL",
            [name],
        ).fetchone()
        assert raw.execute("SELECT tickler_first_claimable(%s)", [name]).fetchone() == direct, name
        firsts.append(direct)
    assert any(first != (None,) for first in firsts)  # the filled queues have such events

    # Every event and timeline entry of before, byte for byte, open ones in tickler_event.
    # (The columns of before; later releases' migrations add columns after them.)
    width = len(before_rows[0])
    after_rows = [r[:width] for r in rows(raw, "tickler_event_all") if r[1] != "busy"]
    assert after_rows == before_rows
    assert [r[:width] for r in rows(raw, "tickler_event") if r[1] != "busy"] == [r for r in before_rows if r[8] is None]
    after_timeline = [r for r in raw.execute("SELECT * FROM tickler_timeline ORDER BY id") if r[1] != "busy"]
    assert after_timeline == before_timeline
    after = readable(store, keys, now)
    assert after["timelines"] == before["timelines"]
    assert after["counts"] == before["counts"]
    assert [g for g in after["gauges"] if g.name != "busy"] == [g for g in before["gauges"] if g.name != "busy"]

    # What only the new schema answers, against the rows of before: an event by key (the open
    # one, else the latest), search including finished events, the queue's history settings.
    by_id = {row[0]: row for row in before_rows}
    for queue, key in keys:
        if key == "nightly":  # the schedule's own key has entries, no event
            continue
        event = store.events.get(queue, key, now=now)
        expected = [r for r in before_rows if r[1] == queue and r[2] == key]
        open_ones = [r for r in expected if r[8] is None]
        assert event.id == (open_ones[0][0] if open_ones else max(r[0] for r in expected)), key
        assert event.version == by_id[event.id][18] and event.data == by_id[event.id][5]
    found = store.events.search("emails", SearchFilter(limit=100), now=now)
    assert sorted(e.id for e in found) == sorted(r[0] for r in before_rows if r[1] == "emails")
    assert [e.id for e in found] == [e.id for e in sorted(found, key=_order)]
    assert {q.name: q.retention_days for q in store.queues.list()} == {"busy": 3650, "digests": 3650, "emails": 3650}
    assert store.queues.put("new", QueueSettings(), Settings()).queue.retention_days == 30


def one_value(raw: psycopg.Connection[Any], query: str) -> Any:
    row = raw.execute(query).fetchone()
    assert row is not None
    return row[0]


def _order(event: Event) -> tuple[datetime, int]:
    return event.schedule_on, event.id


# -- the lease table (migration 0060) ------------------------------------------------------------

LEASE_PREVIOUS = 46  # the last migration of the release before the lease table


def test_upgrade_to_the_lease_table_keeps_live_leases_and_fencing(admin_url: str) -> None:
    """Leases taken by the previous release (ungrouped, grouped, and one that expired without
    being reaped) move into tickler_lease: after the upgrade a live lease is acked or nacked by
    its id, the group lease finishes its events, the stale lease is still fenced (and reaped), and
    nothing is finished twice."""
    with pg.migrated_database(admin_url, "tickler_upgrade_lease", through=LEASE_PREVIOUS) as (url, engine, raw):
        store = Store(engine)
        now = datetime.now(UTC).replace(microsecond=0)
        past = now - timedelta(hours=2)
        queue = add_queue(engine, store, "emails", max_attempts=3)  # leases of a day
        grouped = add_queue(engine, store, "digests")
        late = add_queue(engine, store, "late", max_attempts=3)
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"due{i}", data={"i": i}, schedule_on=past) for i in range(3)],
            actor="app",
            now=past,
        )
        live = previous_claim(engine, queue, worker="w", limit=2, now=past + timedelta(minutes=1))
        # the stale lease: taken two days ago for a day, never reaped
        store.events.schedule(late, NewEvent(item_key="old", data={}, schedule_on=now - timedelta(days=3)), actor="app")
        [stale] = previous_claim(engine, late, worker="w", limit=1, now=now - timedelta(days=2))
        store.events.schedule_batch(
            grouped,
            [NewEvent(item_key=f"g{i}", data={}, group_key="ana", schedule_on=past) for i in range(2)],
            actor="app",
            now=past,
        )
        [group_lease] = previous_claim(engine, grouped, worker="w", limit=1, groups=True, now=past)
        leased_before = set(raw.execute("SELECT lease_id, id FROM tickler_event WHERE lease_id IS NOT NULL").fetchall())
        assert len(leased_before) == 5
        keys = [(q, k) for q, k in raw.execute("SELECT DISTINCT queue, item_key FROM tickler_timeline")]
        before = readable(store, keys, now)

        assert 60 in numbered(migrate(url))  # and whatever came after it

        moved = set(raw.execute("SELECT lease_id, event_id FROM tickler_lease").fetchall())
        assert moved == leased_before
        assert readable(store, keys, now) == before  # timelines, counts, gauges
        # the stale lease is fenced: neither acked nor extended, and told as expired
        assert store.leases.ack([stale]) == {}
        with pytest.raises(StaleLease):
            store.leases.extend(stale, seconds=60)
        assert store.leases.fate(stale) == "expired"
        # live leases work by their ids
        assert store.leases.ack_one(live[0]) == "emails"
        assert store.leases.nack(live[1], error="later").retried == 1
        assert store.leases.ack([group_lease]) == {group_lease: "digests"}
        assert store.leases.ack([live[0]]) == {}  # finished once
        # the reaper ends the stale one as before: one more attempt counted, pending again
        assert store.leases.expire(queue="late") == {"late": 1}
        old = store.events.get("late", "old", now=now)
        assert old.lease_id is None and old.redeliver_count == 1 and old.last_error == "lease expired"
        assert one_value(raw, "SELECT count(*) FROM tickler_lease") == 0
        finished = raw.execute("SELECT id, count(*) FROM tickler_event_history GROUP BY id").fetchall()
        assert sorted(n for _, n in finished) == [1, 1, 1]  # due0 (acked), g0 and g1 (the group)


HISTORY_ID_PREVIOUS = 61  # the last migration before history lost its index by id (0063)


def give_this_release_claim(raw: psycopg.Connection[Any]) -> None:
    """This release's store claims through tickler_claim_events() (migration 0067, latest 0073)
    and asks tickler_groups_due() (0068), whose statements read nothing that the databases of 0061
    on lack (the same statements ran inline before), and takes its lease ids from
    tickler_new_lease_id() (0073). Given to a previous database, they let this release's store
    write the state to upgrade; the migrations replace them with themselves."""
    for migration in available_migrations():
        if migration.version in (67, 68, 73):
            raw.execute(migration.sql)
    give_this_release_claim_call(raw)


def give_this_release_claim_call(raw: psycopg.Connection[Any]) -> None:
    """This release calls the claim with p_fair (whether the queue is a fair one); the plain queues
    of these tests are claimed by 0073's statement. The code files replace this with the claim."""
    raw.execute(
        "CREATE FUNCTION tickler_claim_events(p_queue text, p_worker text, p_limit integer,"
        " p_lease_seconds double precision, p_now timestamptz, p_flow boolean, p_fair boolean)"
        " RETURNS TABLE (event tickler_event, lease_ended boolean, died bigint) LANGUAGE sql"
        " AS $$ SELECT * FROM tickler_claim_events(p_queue, p_worker, p_limit, p_lease_seconds, p_now, p_flow) $$"
    )


def test_upgrade_to_history_without_its_id_index_keeps_reads_and_an_unfinished_archive_run(admin_url: str) -> None:
    """Finished events (delivered, dead; a key reused on two days) and an archive run left
    unfinished by the previous release (its items: run and event ids only): after 0063 the event
    of a key, a key's events by id and the retry of a dead event read the same rows as the
    previous release read by id, and the run's items carry what finds their events in history."""
    with pg.migrated_database(admin_url, "tickler_upgrade_history", through=HISTORY_ID_PREVIOUS) as (url, engine, raw):
        give_this_release_claim(raw)
        store = Store(engine)
        queue = add_queue(engine, store, "emails", max_attempts=3)
        today = raw.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC')").fetchone()[0]  # type: ignore[index]
        days = [today.replace(tzinfo=UTC) + timedelta(days=n, hours=1) for n in (1, 2)]
        store.history.maintain(now=days[-1])
        for at in days:  # k1 delivered on each day
            store.events.schedule(queue, NewEvent(item_key="k1", data={"at": str(at)}), actor="app", now=at)
            [lease] = store.leases.claim(queue, worker="w", limit=1, now=at)
            assert ack_before_0072(engine, [lease.lease_id], now=at)
        store.events.schedule(queue, NewEvent(item_key="dead", data={}), actor="app", now=days[0])
        [lease] = store.leases.claim(queue, worker="w", limit=1, now=days[0])
        store.leases.nack(lease.lease_id, error="boom", dead=True, now=days[0])
        by_id = {
            row[0]: row
            for row in raw.execute(
                "SELECT id, item_key, data, dequeued_on, outcome, version FROM tickler_event_history"
            )
        }
        assert len(by_id) == 3
        run_id = one_value(
            raw,
            "INSERT INTO tickler_archive_run (cutoff, location, event_count, timeline_count, event_id_sum,"
            " timeline_id_sum) VALUES (now(), '/tmp/a', 3, 0, 0, 0) RETURNING id",
        )
        raw.execute(  # as the previous release's select_run_events recorded them
            "INSERT INTO tickler_archive_item (run_id, event_id) SELECT %s, id FROM tickler_event_history", [run_id]
        )

        assert 63 in numbered(migrate(url))

        assert one_value(raw, "SELECT to_regclass('tickler_event_history_id') IS NULL") is True
        items = raw.execute(
            "SELECT count(*) FROM tickler_archive_item AS i JOIN tickler_event_history AS e"
            " ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id"
            " AND e.dequeued_on = i.dequeued_on"
        ).fetchone()
        assert items == (3,)
        latest = store.events.get("emails", "k1")
        newest = max(i for i, row in by_id.items() if row[1] == "k1")
        assert (latest.id, latest.data, latest.status) == (newest, by_id[newest][2], "delivered")
        found = store.events.get_many("emails", "k1", sorted(by_id))
        assert {(e.id, e.dequeued_on, e.status, e.version) for e in found} == {
            (i, row[3], row[4], row[5]) for i, row in by_id.items() if row[1] == "k1"
        }
        [dead] = [i for i, row in by_id.items() if row[1] == "dead"]
        assert store.events.get("emails", "dead").status == "dead"
        raw.execute("DELETE FROM tickler_archive_item")  # the run's events may be retried again
        retried = EventOperations(store.events.engine).retry(
            "emails", "dead", actor="ops", now=days[0] + timedelta(minutes=1)
        )
        assert retried.id == dead and retried.status == "pending"


# -- one statement trigger per operation (migration 0065) ----------------------------------------

TRIGGERS_PREVIOUS = 64  # the last migration with a trigger per task on tickler_event


def test_upgrade_to_one_trigger_per_operation_keeps_counters_leases_and_history(admin_url: str) -> None:
    """A database of the previous triggers, with open, grouped, leased, delivered, dead and
    cancelled events: after 0065 the counters, the lease rows and the history are the same rows,
    and the statements that come after it (schedule, claim, extend, nack, ack, cancel, a finish as
    an UPDATE) keep all three agreeing with the events."""
    with pg.migrated_database(admin_url, "tickler_upgrade_triggers", through=TRIGGERS_PREVIOUS) as (url, engine, raw):
        give_this_release_claim(raw)
        store = Store(engine)
        now = datetime.now(UTC).replace(microsecond=0)
        past = now - timedelta(hours=1)
        queue = add_queue(engine, store, "emails", max_attempts=2)
        grouped = add_queue(engine, store, "digests")
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"due{i}", data={"i": i}, schedule_on=past) for i in range(8)]
            + [NewEvent(item_key=f"later{i}", data={}, delay_seconds=3600) for i in range(3)],
            actor="app",
            now=past,
        )
        store.events.schedule_batch(
            grouped,
            [NewEvent(item_key=f"g{i}", data={}, group_key=f"grp{i % 2}", schedule_on=past) for i in range(4)],
            actor="app",
            now=past,
        )
        leases = store.leases.claim(queue, worker="w", limit=6)
        group_leases = store.leases.claim(grouped, worker="w", limit=1)
        ack_before_0072(engine, [leases[0].lease_id])
        store.leases.nack(leases[1].lease_id, error="stop", dead=True)
        store.leases.nack(leases[2].lease_id, error="later")
        previous_cancel(engine, "emails", "later0", actor="app")

        def state() -> dict[str, Any]:
            return {
                "counts": sorted(
                    raw.execute(
                        "SELECT queue, state, sum(n)::bigint FROM tickler_queue_count GROUP BY 1, 2 HAVING sum(n) <> 0"
                    ).fetchall()
                ),
                "history_counts": sorted(
                    raw.execute(
                        "SELECT day, queue, outcome, sum(n)::bigint FROM tickler_history_count GROUP BY 1, 2, 3"
                    ).fetchall()
                ),
                "leases": sorted(raw.execute("SELECT * FROM tickler_lease").fetchall()),
                "history": rows(raw, "tickler_event_history"),
                "events": rows(raw, "tickler_event"),
            }

        def agreeing() -> None:
            counted = raw.execute(
                "SELECT queue, coalesce(outcome, 'open'), count(*) FROM tickler_event_all GROUP BY 1, 2"
            ).fetchall()
            assert sorted(state()["counts"]) == sorted(counted)
            leased = raw.execute(
                "SELECT lease_id, id, queue, group_key, fairness_key, lease_expires_on FROM tickler_event"
                " WHERE lease_id IS NOT NULL AND dequeued_on IS NULL"
            ).fetchall()
            in_table = raw.execute(
                "SELECT lease_id, event_id, queue, group_key, fairness_key, expires_on FROM tickler_lease"
            ).fetchall()
            assert sorted(in_table) == sorted(leased)
            assert one_value(raw, "SELECT count(*) FROM tickler_event WHERE dequeued_on IS NOT NULL") == 0

        agreeing()
        before = state()
        assert len(before["leases"]) == 3 + 2  # three of emails', the group's two events
        assert len(before["history"]) == 3

        assert 65 in numbered(migrate(url))

        assert state() == before
        triggers = raw.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'tickler_event'::regclass AND NOT tgisinternal"
            " AND tgname NOT IN ('tickler_event_group_fairness', 'tickler_keep_leases_truncated') ORDER BY 1"
        ).fetchall()
        assert triggers == [("tickler_event_deleted",), ("tickler_event_inserted",), ("tickler_event_updated",)]
        # the statements after the upgrade keep all three
        store.events.schedule(queue, NewEvent(item_key="new", data={}, delay_seconds=3600), actor="app")
        agreeing()
        store.leases.extend(leases[3].lease_id, seconds=600)
        agreeing()
        store.leases.ack([leases[3].lease_id, group_leases[0].lease_id])
        agreeing()
        store.leases.nack(leases[4].lease_id, error="stop", dead=True)
        agreeing()
        again = store.leases.claim(queue, worker="w2", limit=20)
        agreeing()
        raw.execute(PREVIOUS_ACK, {"lease_ids": [again[0].lease_id]})  # a finish as an UPDATE
        agreeing()
        store.leases.release([lease.lease_id for lease in again[1:]], actor="w2")
        store.events.cancel("emails", "new", actor="app")
        agreeing()
        after = state()
        assert len(after["history"]) == len(before["history"]) + 6  # leases 3, 4, the group's two, again[0], new
        assert [row[1] for row in after["leases"]] == [leases[5].events[0].id]


# -- retention per queue: each day partitioned by queue (migration 0074) -------------------------

RETENTION_PREVIOUS = 73  # the last migration with whole-day partitions only


def test_upgrade_to_parts_by_retention_keeps_every_row_and_each_queues_retention_after_it(admin_url: str) -> None:
    """A database of whole-day partitions (today's holding two queues' finished events, the next
    days' empty): after 0074 every event, timeline entry and counter is the same; the day that
    holds rows stays whole (it goes when every queue allows, as it did), the empty days ahead are
    made again by queue, and the events finished on them go by each queue's own retention."""
    with pg.migrated_database(admin_url, "tickler_upgrade_retention", through=RETENTION_PREVIOUS) as (url, engine, raw):
        give_this_release_claim_call(raw)
        store = Store(engine)
        queues = {name: add_queue(engine, store, name) for name in ("keeps", "brief")}
        raw.execute("UPDATE tickler_queue SET retention_days = CASE name WHEN 'brief' THEN 1 ELSE 30 END")
        today = raw.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC')").fetchone()[0]  # type: ignore[index]
        today = today.replace(tzinfo=UTC)

        def deliver(queue: Queue, key: str, at: datetime | None) -> None:
            store.events.schedule(queue, NewEvent(item_key=key, data={"k": key}), actor="app", now=at)
            [lease] = store.leases.claim(queue, worker="w", limit=1, now=at)
            store.leases.ack([lease.lease_id], now=at)

        for name, queue in queues.items():
            deliver(queue, f"{name}-before", None)
        # open (waiting, grouped), in flight, dead and cancelled events beside the delivered ones
        keeps, brief = queues["keeps"], queues["brief"]
        store.events.schedule(keeps, NewEvent(item_key="flying", data={}), actor="app")
        [flying] = store.leases.claim(keeps, worker="w", limit=1)
        for key, group in (("open", None), ("g1", "g"), ("g2", "g")):
            event = NewEvent(item_key=key, data={"k": key}, group_key=group, delay_seconds=10 * 86400)
            store.events.schedule(keeps, event, actor="app")
        store.events.schedule(brief, NewEvent(item_key="dead", data={}), actor="app")
        [dying] = store.leases.claim(brief, worker="w", limit=1)
        store.leases.nack(dying.lease_id, error="boom", dead=True)
        store.events.schedule(brief, NewEvent(item_key="cancelled", data={}, delay_seconds=60), actor="app")
        previous_cancel(engine, "brief", "cancelled", actor="app")
        keys = [("keeps", k) for k in ("keeps-before", "flying", "open", "g1", "g2")] + [
            ("brief", k) for k in ("brief-before", "dead", "cancelled")
        ]
        day_ahead = f"tickler_event_history_{today + timedelta(days=2):%Y%m%d}"
        assert one_value(raw, f"SELECT relkind FROM pg_class WHERE relname = '{day_ahead}'") == "r"

        def state() -> dict[str, Any]:
            return {
                "events": rows(raw, "tickler_event"),
                "leases": raw.execute("SELECT * FROM tickler_lease ORDER BY event_id").fetchall(),
                "history": rows(raw, "tickler_event_history"),
                "timeline": rows(raw, "tickler_timeline_all"),
                "by_key": {key: without_added(store.events.get(*key)) for key in keys},
                "timelines": {key: store.events.timeline(*key) for key in keys},
                "counts": {name: store.queues.counts(name, now=seen_at) for name in queues},
                "gauges": store.queues.gauges(None, now=seen_at),
            }

        seen_at = datetime.now(UTC)  # the one clock of both readings
        before = state()
        assert 74 in numbered(migrate(url))
        assert state() == before
        store.leases.ack([flying.lease_id])  # the lease taken before the upgrade still finishes its event
        assert store.events.get("keeps", "flying").status == "delivered"
        today_table = f"tickler_event_history_{today:%Y%m%d}"
        kinds = dict(
            raw.execute(
                "SELECT relname, relkind FROM pg_class WHERE relname = ANY(%s)", [[today_table, day_ahead]]
            ).fetchall()
        )
        assert kinds == {today_table: "r", day_ahead: "p"}  # the day with rows stays whole
        parts = raw.execute(
            "SELECT retention_days, queues FROM tickler_history_partition WHERE day_table = %s"
            " AND queues IS NOT NULL ORDER BY 1",
            [day_ahead],
        ).fetchall()
        assert parts == [(1, ["brief"]), (30, ["keeps"])]

        # Events finished on a day made by 0074 go by their queue's retention; the day from
        # before it, when every queue allows.
        on_day_ahead = today + timedelta(days=2, hours=1)
        for name, queue in queues.items():
            deliver(queue, f"{name}-after", on_day_ahead)
        store.history.maintain(now=today + timedelta(days=4))
        kept = {row[0] for row in raw.execute("SELECT item_key FROM tickler_event_history")}
        assert kept == {"keeps-before", "brief-before", "keeps-after", "flying", "dead", "cancelled"}
        assert store.queues.counts("brief")["delivered"] == 1
        store.history.maintain(now=today + timedelta(days=31))
        assert {row[0] for row in raw.execute("SELECT item_key FROM tickler_event_history")} == {"keeps-after"}
        assert {row[0] for row in raw.execute("SELECT item_key FROM tickler_event")} == {"open", "g1", "g2"}
        assert store.queues.counts("keeps")["delivered"] == 1


def test_upgrade_to_parts_by_retention_keeps_a_row_committed_while_it_runs(admin_url: str) -> None:
    """0074 remakes today and the days ahead by queue when they are empty. A writer of the
    previous release that has written a row into such a day, not yet committed, when the upgrade
    looks: the upgrade waits for it, sees the row and keeps the day (a first version found the day
    empty and dropped it with the row once the writer committed)."""
    url = pg.create_database(admin_url, prefix="tickler_upgrade_retention_race")
    migrate(url, through=RETENTION_PREVIOUS)
    try:
        with (
            psycopg.connect(libpq_url(url), autocommit=True) as raw,
            psycopg.connect(libpq_url(url)) as writer,
        ):
            raw.execute(
                "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
                " backoff_max_seconds, backoff_multiplier) VALUES ('emails', 'pull', 30, 3, 1, 60, 2)"
            )
            writer.execute(
                "INSERT INTO tickler_event_history (id, queue, item_key, schedule_on, enqueued_by, max_attempts,"
                " dequeued_on, dequeued_by, outcome)"
                " VALUES (1, 'emails', 'k', now(), 'app', 3, now(), 'w', 'delivered')"  # today: the first day looked at
            )
            outcome: dict[str, Any] = {}

            def upgrade() -> None:
                try:
                    outcome["applied"] = numbered(migrate(url))
                except Exception as error:  # reported below
                    outcome["error"] = error

            thread = threading.Thread(target=upgrade)
            thread.start()
            wait_until(
                lambda: one_value(raw, "SELECT count(*) FROM pg_locks WHERE NOT granted") > 0,
                what="the upgrade waiting for the writer",
            )
            writer.commit()
            thread.join(timeout=120)
            assert not thread.is_alive() and "error" not in outcome, outcome
            assert 74 in outcome["applied"]
            assert one_value(raw, "SELECT count(*) FROM tickler_event_history WHERE item_key = 'k'") == 1
            assert one_value(raw, "SELECT sum(n) FROM tickler_queue_count WHERE queue = 'emails'") == 1
    finally:
        pg.drop_database(admin_url, url)
