"""History by day (SPEC §9, migration 0021): a finish moves the event out of the open events in
the same statement; finished events and the timeline are kept in day partitions; retention drops
whole days, never open events, never an unarchived day under archive_before_prune."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import plan_nodes
from tests.helpers_wait import wait_until
from tests.test_plans import claim_plan, plan
from tickler.config import Settings
from tickler.pipeline import db
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store


def db_today(raw: psycopg.Connection[Any]) -> datetime:
    """The start of the database's day (UTC)."""
    row = raw.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'").fetchone()
    assert row is not None
    return row[0].astimezone(UTC)  # type: ignore[no-any-return]


def one(raw: psycopg.Connection[Any], query: str, params: list[Any] | None = None) -> Any:
    row = raw.execute(query, params or []).fetchone()
    assert row is not None
    return row[0]


def counters(raw: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    """The trigger-kept counters of a queue, and the same counted from the rows."""
    kept = dict(
        raw.execute(
            "SELECT state, sum(n)::bigint FROM tickler_queue_count WHERE queue = %s GROUP BY 1 HAVING sum(n) <> 0",
            [queue],
        ).fetchall()
    )
    counted = dict(
        raw.execute(
            "SELECT coalesce(outcome, 'open'), count(*) FROM tickler_event_all WHERE queue = %s GROUP BY 1", [queue]
        ).fetchall()
    )
    assert kept == counted, (kept, counted)
    return {state: int(n) for state, n in kept.items()}


def deliver(store: Store, queue: Queue, keys: list[str], *, at: datetime | None = None) -> None:
    """Schedule `keys` due at `at` (or now), claim and ack them at `at`."""
    store.events.schedule_batch(
        queue, [NewEvent(item_key=k, data={}, schedule_on=at) for k in keys], actor="app", now=at
    )
    leases = store.leases.claim(queue, worker="w", limit=len(keys), now=at)
    assert len(leases) == len(keys)
    store.leases.ack([lease.lease_id for lease in leases], now=at)


def partitions(raw: psycopg.Connection[Any], parent: str) -> set[str]:
    return {row[0] for row in raw.execute("SELECT name FROM tickler_history_partition WHERE parent = %s", [parent])}


# The day's table a row of tickler_event_history or tickler_timeline (as `r`) is in: its part's
# parent (migration 0074), or the partition of the parent itself that holds it (the default one,
# a whole-day one from before 0074).
DAY_OF_ROW = (
    "coalesce((SELECT p.day_table FROM tickler_history_partition AS p WHERE p.name = r.tableoid::regclass::text),"
    " r.tableoid::regclass::text)"
)


def by_class(names: tuple[str, ...]) -> set[str]:
    """Table names with a part's counter left out (`..._r30_2`, a second part of class 30 of a
    day made for queues created later, is `..._r30`)."""
    return {re.sub(r"(_r\d+)_\d+$", r"\1", name) for name in names}


def queues_kept(raw: psycopg.Connection[Any], day: datetime) -> dict[str, set[str]]:
    """The queues with finished events and with timeline entries of this day (UTC)."""
    span = [day, day + timedelta(days=1)]
    history = raw.execute(
        "SELECT DISTINCT queue FROM tickler_event_history WHERE dequeued_on >= %s AND dequeued_on < %s", span
    )
    timeline = raw.execute("SELECT DISTINCT queue FROM tickler_timeline WHERE at >= %s AND at < %s", span)
    return {"history": {r[0] for r in history}, "timeline": {r[0] for r in timeline}}


def test_a_finish_moves_the_event_into_history_in_the_same_statement(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    deliver(store, queue, ["a", "b"])
    store.events.schedule(queue, NewEvent(item_key="c", data={}, delay_seconds=3600), actor="app")
    store.events.cancel("emails", "c", actor="app")
    store.events.schedule(queue, NewEvent(item_key="open", data={}, delay_seconds=3600), actor="app")
    # the open events' table holds only the open one; the finished ones are in today's partition
    assert [r[0] for r in raw.execute("SELECT item_key FROM tickler_event").fetchall()] == ["open"]
    moved = raw.execute(
        f"SELECT item_key, outcome, {DAY_OF_ROW} FROM tickler_event_history AS r ORDER BY id"
    ).fetchall()
    day = "tickler_event_history_" + db_today(raw).strftime("%Y%m%d")
    assert moved == [("a", "delivered", day), ("b", "delivered", day), ("c", "cancelled", day)]
    # what a client reads is as before
    assert store.events.get("emails", "a").status == "delivered"
    assert counters(raw, "emails") == {"open": 1, "delivered": 2, "cancelled": 1}
    assert store.queues.counts("emails")["delivered"] == 2


def test_claims_due_counts_and_gauges_read_no_history(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    deliver(store, queue, [f"done{i}" for i in range(200)])
    store.events.schedule_batch(queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(20)], actor="app")
    plans = {
        # the statement of tickler_claim_events() (migration 0067), on its generic plan
        "claim_events": json.dumps(claim_plan(raw)),
        "lock_due_groups": plan(
            raw,
            "lock_due_groups",
            {"queue": "emails", "limit": 10, "scan": 500, "now": None, "flow": False, "cap": None},
        ),
        "queue_live_counts": plan(raw, "queue_live_counts", {"queue": "emails", "now": None}),
        "queue_gauges": plan(raw, "queue_gauges", {"names": None, "now": None}),
        "flow_room": plan(raw, "flow_room", {"queue": "emails", "now": None}),
    }
    for name, text in plans.items():
        read = read_relations(text)
        assert read and not {r for r in read if r.startswith(("tickler_event_history", "tickler_timeline"))}, name


def read_relations(plan_text: str) -> set[str]:
    """The relations a plan reads (scans of any kind; a claim may write timeline rows, not read them)."""
    return {
        node["Relation Name"]
        for node in plan_nodes(json.loads(plan_text))
        if str(node.get("Node Type", "")).endswith("Scan") and "Relation Name" in node
    }


def test_retention_drops_each_queues_days_past_its_own_retention(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    today = db_today(raw)
    short = make_queue("short", retention_days=2)
    long = make_queue("long", retention_days=5)
    deliver(store, short, ["s1", "s2"], at=today + timedelta(hours=1))
    deliver(store, long, ["l1"], at=today + timedelta(hours=2))
    deliver(store, short, ["s3"], at=today + timedelta(days=1, hours=1))  # the next day
    store.events.schedule(short, NewEvent(item_key="open", data={}, schedule_on=today), actor="app", now=today)
    day0 = today.strftime("%Y%m%d")

    # Two days on, nothing of theirs is past retention.
    store.history.maintain(now=today + timedelta(days=2))
    assert queues_kept(raw, today) == {"history": {"short", "long"}, "timeline": {"short", "long"}}
    # Three days on, the short queue's first day is past its 2 days: its part of the day goes
    # (both tables), the long queue's part of the same day stays, and so does the next day.
    done = store.history.maintain(now=today + timedelta(days=3))
    assert {f"tickler_event_history_{day0}_r2", f"tickler_timeline_{day0}_r2"} <= by_class(done.dropped)
    assert not {f"tickler_event_history_{day0}_r5", f"tickler_event_history_{day0}"} & by_class(done.dropped)
    assert queues_kept(raw, today) == {"history": {"long"}, "timeline": {"long"}}
    assert queues_kept(raw, today + timedelta(days=1)) == {"history": {"short"}, "timeline": {"short"}}
    # counters follow without a row being counted; the open event (scheduled that day) is untouched
    assert counters(raw, "short") == {"open": 1, "delivered": 1}
    assert counters(raw, "long") == {"delivered": 1}
    assert store.queues.counts("short")["delivered"] == 1
    assert store.events.get("short", "open").status == "pending"
    assert store.events.get("long", "l1").status == "delivered"
    assert [e.action for e in store.events.timeline("short", "s3")] == ["enqueued", "claimed", "delivered"]
    with pytest.raises(NotFound):
        store.events.get("short", "s1")

    # Six days on, the long queue's day goes; the whole partitions from before migration 0074
    # (the upgraded history) go once every queue allows.
    done = store.history.maintain(now=today + timedelta(days=6))
    assert {f"tickler_event_history_{day0}_r5", f"tickler_timeline_{day0}_r5"} <= by_class(done.dropped)
    assert queues_kept(raw, today) == {"history": set(), "timeline": set()}
    assert one(raw, "SELECT to_regclass('tickler_event_history_upgraded') IS NULL")
    assert counters(raw, "long") == {}
    # partitions are made ahead of the maintenance clock, with a part per retention class
    ahead = (today + timedelta(days=9)).strftime("%Y%m%d")
    assert {
        f"tickler_event_history_{ahead}",
        f"tickler_event_history_{ahead}_r2",
        f"tickler_event_history_{ahead}_r5",
        f"tickler_timeline_{ahead}",
    } <= by_class(done.created)


def part_of(raw: psycopg.Connection[Any], parent: str, queue: str) -> set[str]:
    """The tables holding this queue's rows of a history table."""
    rows = raw.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {parent} WHERE queue = %s", [queue])
    return {r[0] for r in rows}


def test_a_queue_created_after_its_day_was_made_gets_its_own_part(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """In the days ahead at the next pass; for the day it was created on, once that day is over
    (a part attached to a day being written could fail a writer, migration 0074)."""
    today = db_today(raw)
    day = f"{today:%Y%m%d}"
    queue = make_queue("created-late", retention_days=3)
    deliver(store, queue, ["a", "b"])
    # today's table was made before the queue: its rows went to the day's `_rest`
    assert part_of(raw, "tickler_event_history", "created-late") == {f"tickler_event_history_{day}_rest"}
    assert part_of(raw, "tickler_timeline", "created-late") == {f"tickler_timeline_{day}_rest"}

    store.history.maintain()  # today is being written: its rows stay; the days ahead list the queue
    assert part_of(raw, "tickler_event_history", "created-late") == {f"tickler_event_history_{day}_rest"}
    in_two_days = f"tickler_event_history_{today + timedelta(days=2):%Y%m%d}"
    assert one(
        raw,
        "SELECT queues FROM tickler_history_partition WHERE day_table = %s AND 'created-late' = ANY(queues)",
        [in_two_days],
    ) == ["created-late"]

    # Once the day is over, its rows of the queue get their part, and go by its retention.
    created = store.history.maintain(now=today + timedelta(days=1, hours=2)).created
    made = {name for name in created if name.startswith(f"tickler_event_history_{day}_r3")}
    assert len(made) == 1 and part_of(raw, "tickler_event_history", "created-late") == made
    assert part_of(raw, "tickler_timeline", "created-late") == {n.replace("event_history", "timeline") for n in made}
    assert counters(raw, "created-late") == {"delivered": 2}  # nothing lost or counted twice
    assert [e.action for e in store.events.timeline("created-late", "a")] == ["enqueued", "claimed", "delivered"]
    dropped = store.history.maintain(now=today + timedelta(days=4)).dropped
    assert f"tickler_event_history_{day}_r3" in by_class(dropped)
    assert queues_kept(raw, today) == {"history": set(), "timeline": set()}
    assert counters(raw, "created-late") == {}


def test_writers_of_queues_created_today_never_fail_while_passes_run(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """The rows of queues created after their day was made go to the day's `_rest` while passes
    run: no pass attaches a part to a day being written (a row routed to `_rest` just before
    would fail PostgreSQL's re-check of its bound), so every write succeeds."""
    queues = [make_queue(f"created-now-{i}", retention_days=2) for i in range(3)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def write(queue: Queue) -> None:
        n = 0
        try:
            while not stop.is_set() or n < 20:
                deliver(store, queue, [f"k{n}"])
                n += 1
        except BaseException as error:  # reported by the test below
            errors.append(error)

    writers = [threading.Thread(target=write, args=(queue,)) for queue in queues]
    for thread in writers:
        thread.start()
    wait_until(  # the passes start while every queue is being written
        lambda: (
            one(raw, "SELECT count(DISTINCT queue) FROM tickler_event_history WHERE queue LIKE 'created-now-%%'") == 3
            or errors
        )
    )
    passes = [store.history.maintain() for _ in range(10)]
    stop.set()
    for thread in writers:
        thread.join(timeout=60)
    assert not errors, errors[0]
    assert any(passes)  # the passes made something (the queues' parts in the days ahead)
    for queue in queues:
        written = one(raw, "SELECT count(*) FROM tickler_event_history WHERE queue = %s", [queue.name])
        assert written >= 20 and counters(raw, queue.name) == {"delivered": written}


def test_a_changed_retention_holds_for_the_days_already_made(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """A queue's days go by its retention_days as set now. Queues that shared a class when a day's
    part was made share the part: lowering one of them drops nothing before the other allows."""
    day = db_today(raw) + timedelta(days=2)  # a day ahead: the pass makes its parts
    shared = [make_queue(name, retention_days=5) for name in ("lowered-shared", "kept-shared")]
    store.history.maintain()  # one part of class 5 lists both
    alone = make_queue("lowered-alone", retention_days=5)
    raised = make_queue("raised-alone", retention_days=1)
    store.history.maintain()  # and one each for these (made later)
    for queue in [*shared, alone, raised]:
        deliver(store, queue, ["k"], at=day + timedelta(hours=1))
    for name, days in (("lowered-shared", 1), ("lowered-alone", 1), ("raised-alone", 4)):
        store.queues.put(name, QueueSettings(retention_days=days), Settings())

    store.history.maintain(now=day + timedelta(days=3))
    assert queues_kept(raw, day)["history"] == {"lowered-shared", "kept-shared", "raised-alone"}
    store.history.maintain(now=day + timedelta(days=5))
    assert queues_kept(raw, day)["history"] == {"lowered-shared", "kept-shared"}
    store.history.maintain(now=day + timedelta(days=6))
    assert queues_kept(raw, day) == {"history": set(), "timeline": set()}
    for name in ("lowered-shared", "kept-shared", "lowered-alone", "raised-alone"):
        assert counters(raw, name) == {}


def test_archive_before_prune_never_drops_an_unarchived_day(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    today = db_today(raw)
    queue = make_queue("emails", retention_days=1, archive_before_prune=True)
    deliver(store, queue, ["a"], at=today + timedelta(hours=1))
    deliver(store, queue, ["b"], at=today + timedelta(days=1, hours=1))
    later = today + timedelta(days=30)
    store.history.maintain(now=later)  # nothing archived yet
    assert counters(raw, "emails") == {"delivered": 2}
    assert queues_kept(raw, today) == {"history": {"emails"}, "timeline": {"emails"}}

    # The archive wrote everything finished before the middle of the next day: today goes, the
    # next day (half written) stays.
    raw.execute(
        "INSERT INTO tickler_archive_progress (archived_through) VALUES (%s)", [today + timedelta(days=1, hours=12)]
    )
    store.history.maintain(now=later)
    assert queues_kept(raw, today) == {"history": set(), "timeline": set()}
    assert queues_kept(raw, today + timedelta(days=1)) == {"history": {"emails"}, "timeline": {"emails"}}
    assert counters(raw, "emails") == {"delivered": 1}
    assert store.events.get("emails", "b").status == "delivered"

    # Without archive_before_prune the same day goes at once.
    store.queues.put("emails", QueueSettings(archive_before_prune=False), Settings())
    store.history.maintain(now=later)
    assert queues_kept(raw, today + timedelta(days=1)) == {"history": set(), "timeline": set()}
    assert counters(raw, "emails") == {}


def test_an_archive_run_records_how_far_it_archived(raw: psycopg.Connection[Any]) -> None:
    """mark_deleted (pipeline/queries.sql) records the archive's progress: up to its cut-off, or
    up to the oldest finished event its limit left behind."""
    today = db_today(raw)
    raw.execute(
        "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
        " backoff_max_seconds, backoff_multiplier) VALUES ('emails', 'pull', 30, 3, 1, 60, 2)"
    )
    left_behind = today + timedelta(hours=3)
    raw.execute(
        "INSERT INTO tickler_event (queue, item_key, schedule_on, enqueued_by, max_attempts, dequeued_on, dequeued_by,"
        " outcome) VALUES ('emails', 'k', %s, 'app', 3, %s, 'w', 'delivered')",
        [left_behind, left_behind],
    )

    def run(cutoff: datetime) -> datetime:
        run_id = one(
            raw,
            "INSERT INTO tickler_archive_run (cutoff, location, state, written_on, event_count, timeline_count,"
            " event_id_sum, timeline_id_sum) VALUES (%s, '/tmp/a', 'written', now(), 0, 0, 0, 0) RETURNING id",
            [cutoff],
        )
        assert raw.execute(db.q("mark_deleted"), {"run_id": run_id}).fetchone() == (run_id,)
        return one(raw, "SELECT archived_through FROM tickler_archive_progress")  # type: ignore[no-any-return]

    assert run(today + timedelta(hours=2)) == today + timedelta(hours=2)
    assert run(today + timedelta(days=1)) == left_behind  # the event a limit left is not archived
    assert run(today + timedelta(hours=1)) == left_behind  # never goes back


def test_nothing_is_dropped_while_an_archive_run_is_unfinished(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    today = db_today(raw)
    queue = make_queue("emails", retention_days=1)
    deliver(store, queue, ["a"], at=today + timedelta(hours=1))
    run_id = one(
        raw,
        "INSERT INTO tickler_archive_run (cutoff, location, event_count, timeline_count, event_id_sum,"
        " timeline_id_sum) VALUES (now(), '/tmp/a', 1, 0, 0, 0) RETURNING id",
    )
    raw.execute(
        "INSERT INTO tickler_archive_item (run_id, event_id) SELECT %s, id FROM tickler_event_history", [run_id]
    )
    assert store.history.maintain(now=today + timedelta(days=10)).dropped == ()
    assert counters(raw, "emails") == {"delivered": 1}


def test_rows_without_their_day_yet_land_in_the_default_partition_and_get_it_later(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    far = db_today(raw) + timedelta(days=40, hours=5)  # no partition that far ahead
    queue = make_queue("emails")
    deliver(store, queue, ["a", "b"], at=far)
    where = {r[0] for r in raw.execute(f"SELECT {DAY_OF_ROW} FROM tickler_event_history AS r")}
    assert where == {"tickler_event_history_default"}
    created = store.history.maintain().created
    day = far.strftime("%Y%m%d")
    assert {f"tickler_event_history_{day}", f"tickler_timeline_{day}"} <= set(created)
    where = {r[0] for r in raw.execute(f"SELECT {DAY_OF_ROW} FROM tickler_event_history AS r")}
    assert where == {f"tickler_event_history_{day}"}
    assert one(raw, "SELECT count(*) FROM tickler_timeline_default") == 0
    assert counters(raw, "emails") == {"delivered": 2}
    assert [e.action for e in store.events.timeline("emails", "a")] == ["enqueued", "claimed", "delivered"]


def test_a_reused_key_keeps_its_timeline_across_the_move_and_a_day_boundary(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    today = db_today(raw)
    queue = make_queue("emails")
    before_midnight = today + timedelta(hours=23, minutes=59)
    deliver(store, queue, ["k"], at=before_midnight)
    first = store.events.get("emails", "k")
    after_midnight = today + timedelta(days=1, minutes=1)
    store.events.schedule(
        queue, NewEvent(item_key="k", data={"n": 2}, delay_seconds=60), actor="app", now=after_midnight
    )
    store.events.cancel("emails", "k", actor="app", now=after_midnight + timedelta(seconds=1))
    second = store.events.get("emails", "k")
    assert second.id != first.id and second.status == "cancelled"
    timeline = store.events.timeline("emails", "k")
    assert [(e.action, e.event_id) for e in timeline] == [
        ("enqueued", first.id),
        ("claimed", first.id),
        ("delivered", first.id),
        ("enqueued", second.id),
        ("cancelled", second.id),
    ]
    days = {r[0] for r in raw.execute(f"SELECT {DAY_OF_ROW} FROM tickler_timeline AS r WHERE item_key = 'k'")}
    assert days == {f"tickler_timeline_{today.strftime('%Y%m%d')}", f"tickler_timeline_{after_midnight:%Y%m%d}"}
    assert [e.id for e in store.events.get_many("emails", "k", [first.id, second.id])] != []
    assert {e.status for e in store.events.get_many("emails", "k", [first.id, second.id])} == {"delivered", "cancelled"}


def test_retention_racing_finishes_loses_and_double_counts_nothing(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """Days are dropped while other transactions finish events into a kept day: every one of
    those is there afterwards, and the counters equal the rows."""
    today = db_today(raw)
    queue = make_queue("emails", retention_days=1)
    deliver(store, queue, [f"old{i}" for i in range(50)], at=today + timedelta(hours=1))
    kept_day = today + timedelta(days=3, hours=1)
    store.events.schedule_batch(
        queue, [NewEvent(item_key=f"new{i}", data={}, schedule_on=kept_day) for i in range(300)], actor="app"
    )
    errors: list[BaseException] = []

    def finish() -> None:
        try:
            while leases := store.leases.claim(queue, worker="w", limit=10, now=kept_day):
                store.leases.ack([lease.lease_id for lease in leases], now=kept_day)
        except BaseException as error:  # reported by the test below
            errors.append(error)

    finishers = [threading.Thread(target=finish) for _ in range(3)]
    for thread in finishers:
        thread.start()
    for _ in range(5):
        store.history.maintain(now=today + timedelta(days=3))
    for thread in finishers:
        thread.join(timeout=60)
    assert not errors
    assert one(raw, "SELECT count(*) FROM tickler_event_history WHERE item_key LIKE 'old%%'") == 0
    assert counters(raw, "emails") == {"delivered": 300}
    assert one(raw, "SELECT count(DISTINCT item_key) FROM tickler_event_history WHERE item_key LIKE 'new%%'") == 300


@pytest.mark.parametrize("retention", [0, 3651])
def test_retention_days_outside_1_to_3650_is_refused_by_the_schema(
    raw: psycopg.Connection[Any], retention: int
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        raw.execute(
            "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
            " backoff_max_seconds, backoff_multiplier, retention_days) VALUES ('q', 'pull', 30, 3, 1, 60, 2, %s)",
            [retention],
        )


def test_queue_json_carries_retention_and_put_keeps_what_is_not_given(client: FlaskClient, admin_token: str) -> None:
    headers = auth(admin_token)
    created = client.put("/v1/queues/emails", json={}, headers=headers)
    assert created.status_code == 201
    assert (created.json["retention_days"], created.json["archive_before_prune"]) == (30, False)
    changed = client.put("/v1/queues/emails", json={"retention_days": 7, "archive_before_prune": True}, headers=headers)
    assert (changed.json["retention_days"], changed.json["archive_before_prune"]) == (7, True)
    kept = client.put("/v1/queues/emails", json={"max_attempts": 4}, headers=headers)
    assert (kept.json["retention_days"], kept.json["archive_before_prune"]) == (7, True)
    for bad in ({"retention_days": 0}, {"retention_days": 3651}, {"retention_days": "7"}, {"archive_before_prune": 1}):
        refused = client.put("/v1/queues/emails", json=bad, headers=headers)
        assert refused.status_code == 400 and refused.mimetype == "application/problem+json", bad
        assert set(refused.json["errors"]) == set(bad), refused.json
    assert client.get("/v1/queues/emails", headers=headers).json["retention_days"] == 7
