"""Single events and the events of one group commit, written by the one path (scheduler/queries.sql
schedule_events, tickler_schedule_events()): every kind of new event under reject and ignore, taken
keys and errors among them — outcomes, events, timeline entries, counts, the wake-up NOTIFY, one
statement per call — and a key taken by another transaction while the group is written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tickler.scheduler import db
from tickler.scheduler.errors import InFlight, KeyConflict
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import Store
from tickler.scheduler.store import base as store_base
from tickler.scheduler.tracing import TraceContext

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the statements the store ran (schedule_events, schedule_batch), in order."""
    names = {driver_sql(name): name for name in ("schedule_events", "schedule_batch")}
    # the writer's look at the planner statistics (store/statistics.py): a job of its own, not the write's
    looks = {driver_sql("hot_tables")}
    ran: list[str] = []
    real = db.driver_rows

    def spy(engine: Any, statement: str, params: Any = None, **kwargs: Any) -> list[Any]:
        if statement not in looks and not statement.startswith("ANALYZE"):
            ran.append(names.get(statement, "other"))
        return real(engine, statement, params, **kwargs)

    monkeypatch.setattr(store_base, "driver_rows", spy)
    return ran


def outcome(
    store: Store, queue: Queue, on_conflict: str, event: NewEvent, now: datetime | None = None, **kw: Any
) -> Any:
    """What a call answers: (outcome, the event as a dict) or (error class, sqlstate)."""
    try:
        found, result = store.events.schedule(queue, event, actor="app", on_conflict=on_conflict, now=now, **kw)
    except KeyConflict as conflict:
        held = conflict.extra["event"]
        return ("KeyConflict", held.item_key, held.version, held.schedule_on)
    except Exception as error:  # the same error on both sides is the point
        original = getattr(error, "orig", error)
        return (type(error).__name__, getattr(original, "sqlstate", None))
    row = vars(found).copy()
    for name in ("id", "queue", "lease_id"):
        row.pop(name)
    return (str(result), row)


def every_field(item_key: str, n: int) -> NewEvent:
    """A new event that gives every field, in group g1 with fairness key f1."""
    return NewEvent(
        item_key,
        {"n": n, "nested": {"x": [1, 2]}},
        group_key="g1",
        schedule_on=datetime(2030, 1, 1, 10, 0, tzinfo=UTC),
        max_attempts=5,
        priority=2,
        fairness_key="f1",
    )


def calls(queue: Queue, unknown: Queue) -> list[tuple[Queue, str, NewEvent, dict[str, Any]]]:
    """Every kind of single new event under reject and ignore, taken keys and errors among them."""
    at = [T0 + timedelta(seconds=10 * n) for n in range(20)]
    return [
        (queue, "reject", every_field("a", 1), {"now": at[0]}),  # created, every field given
        (queue, "reject", NewEvent("a", {}, delay_seconds=5), {"now": at[1]}),  # taken: KeyConflict
        (queue, "ignore", NewEvent("a", {}), {"now": at[2]}),  # taken: the open event, ignored
        (queue, "ignore", NewEvent("b", {}, delay_seconds=60.5, fairness_key="fb"), {"now": at[3]}),  # created
        (queue, "reject", NewEvent("c", {}, schedule_on=datetime(2029, 12, 31, tzinfo=UTC)), {"now": at[4]}),  # due
        (queue, "reject", NewEvent("d", {}, priority=-100, max_attempts=1), {"now": at[5]}),
        (queue, "reject", NewEvent("e", {}, group_key="g1", fairness_key="other"), {"now": at[6]}),  # group's key
        (queue, "reject", NewEvent("f", {}, max_attempts=0), {"now": at[7]}),  # out of range
        (queue, "reject", NewEvent("g", {}, priority=99999), {"now": at[8]}),  # beyond smallint
        (queue, "reject", NewEvent("h/1", {}), {"now": at[9]}),  # key syntax
        (unknown, "reject", NewEvent("i", {}), {"now": at[10]}),  # no such queue
        (queue, "reject", NewEvent("j", {"trace": True}), {"now": at[11], "trace": TraceContext(TRACE, None)}),
        (queue, "reject", NewEvent("k", {}), {}),  # the database's clock
    ]


def state(raw: psycopg.Connection[Any], queue: str) -> dict[str, Any]:
    """The queue's events, timeline and counts, ids numbered in order of appearance."""
    ids: dict[int, int] = {}

    def number(value: int) -> int:
        return ids.setdefault(value, len(ids) + 1)

    events = []
    for (row,) in raw.execute(
        "SELECT to_jsonb(e) - 'queue' - 'lease_id' - 'enqueued_on' - 'schedule_on' FROM tickler_event_all AS e"
        " WHERE queue = %s ORDER BY id",
        [queue],
    ):
        row["id"] = number(row["id"])
        events.append(row)
    timeline = [
        (key, number(event_id), action, actor, details)
        for key, event_id, action, actor, details in raw.execute(
            "SELECT item_key, event_id, action, actor, details FROM tickler_timeline_all WHERE queue = %s ORDER BY id",
            [queue],
        )
    ]
    counts = raw.execute(
        "SELECT state, sum(n) FROM tickler_queue_count WHERE queue = %s GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1",
        [queue],
    ).fetchall()
    return {"events": events, "timeline": timeline, "counts": counts}


def test_one_new_event_writes_and_answers_in_one_statement(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], statements: list[str]
) -> None:
    queue = make_queue("schedule_new_on", max_attempts=4)
    unknown = replace(queue, name="schedule_new_gone")
    answers = [outcome(store, q, mode, event, **kw) for q, mode, event, kw in calls(queue, unknown)]
    assert [a[0] for a in answers] == [
        "created", "KeyConflict", "ignored", "created", "created", "created", "IntegrityError", "IntegrityError",
        "DataError", "IntegrityError", "IntegrityError", "created", "created",
    ], answers  # fmt: skip
    # the errors: the group's other fairness key, max_attempts out of range, priority beyond
    # smallint, the key's syntax, no such queue
    assert [answers[n][1] for n in range(6, 11)] == ["23514", "23514", "22003", "23514", "23503"]
    created = answers[0][1]
    assert created["schedule_on"] == datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    assert created["enqueued_on"] == T0 and created["version"] == 1 and created["max_attempts"] == 5
    assert (created["group_key"], created["priority"], created["fairness_key"]) == ("g1", 2, "f1")
    assert created["data"] == {"n": 1, "nested": {"x": [1, 2]}} and created["enqueued_by"] == "app"
    assert answers[1][1:] == ("a", 1, datetime(2030, 1, 1, 10, 0, tzinfo=UTC))  # the open event, as it is
    assert answers[2][1] == created  # ignored: the open event
    assert answers[3][1]["schedule_on"] == T0 + timedelta(seconds=30, milliseconds=60_500)
    assert answers[3][1]["max_attempts"] == 4 and answers[3][1]["fairness_key"] == "fb"  # the queue's default
    assert answers[4][1]["schedule_on"] == datetime(2029, 12, 31, tzinfo=UTC)  # in the past: due
    assert answers[11][1]["traceparent"] == TRACE
    written = state(raw, queue.name)
    assert [e["item_key"] for e in written["events"]] == ["a", "b", "c", "d", "j", "k"]
    assert [(key, action, details) for key, _, action, _, details in written["timeline"]] == [
        ("a", "enqueued", {"group_key": "g1", "max_attempts": 5, "priority": 2, "fairness_key": "f1"}),
        ("b", "enqueued", {"max_attempts": 4, "fairness_key": "fb"}),
        ("c", "enqueued", {"max_attempts": 4}),
        ("d", "enqueued", {"max_attempts": 1, "priority": -100}),
        ("j", "enqueued", {"max_attempts": 4}),
        ("k", "enqueued", {"max_attempts": 4}),
    ]
    assert dict(written["counts"]) == {"open": 6}
    # one statement per call, errors and all
    assert statements == ["schedule_events"] * len(answers)


def test_a_new_event_due_before_the_dispatchers_next_look_wakes_them(
    store: Store, make_queue: Callable[..., Queue], database_url: str, statements: list[str]
) -> None:
    from tickler.scheduler.db import libpq_url

    later, sooner = make_queue("schedule_new_later"), make_queue("schedule_new_sooner")
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute("LISTEN tickler_wake")
        listener.execute(
            "UPDATE tickler_queue SET next_wake = %s WHERE name = ANY(%s)",
            [T0 + timedelta(hours=1), [later.name, sooner.name]],
        )
        # due after the dispatchers' next look (they find it then), then due before it
        store.events.schedule(later, NewEvent("late", {}, delay_seconds=7200), actor="app", now=T0)
        store.events.schedule(sooner, NewEvent("soon", {}, delay_seconds=60), actor="app", now=T0)
        # notifications arrive in commit order: a NOTIFY of the first would come first
        first = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert first == [sooner.name]
    assert statements == ["schedule_events", "schedule_events"]


def group_answers(store: Store, queue: Queue, mode: str, events: list[NewEvent], now: datetime) -> Any:
    """What a group commit's write answers per item (scheduled, the event without its id), or the
    error it raises (then group commit writes the group's items alone)."""
    try:
        rows = store.events._write_group((queue.name, "app", mode, now, None), [(e, None) for e in events])
    except Exception as error:
        original = getattr(error, "orig", error)
        return (type(error).__name__, getattr(original, "sqlstate", None))
    answers = []
    for row in rows:
        kept = {k: v for k, v in row.items() if k not in ("id", "queue", "lease_id")}
        answers.append(kept)
    return answers


def groups(queue: Queue, unknown: Queue) -> list[tuple[Queue, str, list[NewEvent]]]:
    """Groups of new events under reject and ignore: free keys, taken keys, every field, errors."""
    return [
        (queue, "reject", [NewEvent("a", {"n": 1}), NewEvent("b", {}, delay_seconds=60.5), NewEvent("c", {})]),
        (
            queue,
            "reject",
            [
                every_field("d", 2),
                NewEvent("a", {}),  # taken: conflict, the open event
                NewEvent("e", {}, priority=-100, max_attempts=1, group_key="g1", fairness_key="f1"),
            ],
        ),
        (queue, "ignore", [NewEvent("b", {}), NewEvent("f", {}, fairness_key="ff"), NewEvent("c", {})]),
        (queue, "reject", [NewEvent("g", {}), NewEvent("h", {}, group_key="g1", fairness_key="other")]),  # refused
        (queue, "reject", [NewEvent("i", {}), NewEvent("j/1", {})]),  # key syntax
        (unknown, "reject", [NewEvent("k", {}), NewEvent("l", {})]),  # no such queue
        (queue, "reject", [NewEvent("m", {}, schedule_on=datetime(2029, 12, 31, tzinfo=UTC)), NewEvent("n", {})]),
    ]


def test_a_group_of_new_events_writes_and_answers_in_one_statement(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], statements: list[str]
) -> None:
    queue = make_queue("schedule_many_on", max_attempts=4)
    unknown = replace(queue, name="schedule_many_gone")
    answers = [
        group_answers(store, q, mode, events, T0 + timedelta(seconds=10 * n))
        for n, (q, mode, events) in enumerate(groups(queue, unknown))
    ]
    outcomes = [a if isinstance(a, tuple) else [row["scheduled"] for row in a] for a in answers]
    assert outcomes == [
        ["created", "created", "created"],
        ["created", "conflict", "created"],
        ["conflict", "created", "conflict"],
        ("IntegrityError", "23514"),
        ("IntegrityError", "23514"),
        ("IntegrityError", "23503"),
        ["created", "created"],
    ], outcomes
    positions = [[row["ord"] for row in a] for a in answers if isinstance(a, list)]
    assert positions == [[0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1]]
    second = answers[1]
    assert isinstance(second, list)
    assert [(r["item_key"], r["enqueued_on"], r["version"]) for r in second] == [
        ("d", T0 + timedelta(seconds=10), 1),
        ("a", T0, 1),  # the open event that holds the key
        ("e", T0 + timedelta(seconds=10), 1),
    ]
    assert second[0]["schedule_on"] == datetime(2030, 1, 1, 10, 0, tzinfo=UTC) and second[0]["priority"] == 2
    assert second[2]["max_attempts"] == 1 and second[2]["fairness_key"] == "f1"
    written = state(raw, queue.name)
    assert [e["item_key"] for e in written["events"]] == ["a", "b", "c", "d", "e", "f", "m", "n"]
    # a group's entries in the order of its items; a refused group wrote nothing
    assert [(key, action) for key, _, action, _, _ in written["timeline"]] == [
        (key, "enqueued") for key in ("a", "b", "c", "d", "e", "f", "m", "n")
    ]
    assert dict(written["counts"]) == {"open": 8}
    assert statements == ["schedule_events"] * len(answers)


def test_a_key_taken_while_the_group_is_written_is_answered_by_the_same_statement(
    store: Store,
    make_queue: Callable[..., Queue],
    database_url: str,
    raw: psycopg.Connection[Any],
    statements: list[str],
) -> None:
    """An item whose key an event took after the group's statement began (its insert waited on
    that event's transaction, then gave way): the same statement reads the event that took it and
    answers the conflict; the group's other items are written once."""
    from tickler.scheduler.db import libpq_url

    queue = make_queue("schedule_many_race")
    with psycopg.connect(libpq_url(database_url)) as other:
        other.execute(
            "INSERT INTO tickler_event (queue, item_key, schedule_on, enqueued_by, max_attempts)"
            " VALUES (%s, 'x', now() + interval '1 hour', 'other', 3)",
            [queue.name],
        )
        result: list[Any] = []
        writer = threading.Thread(
            target=lambda: result.append(
                store.events._write_group(
                    (queue.name, "app", "reject", None, None), [(NewEvent("y", {}), None), (NewEvent("x", {}), None)]
                )
            )
        )
        writer.start()
        wait_until(
            lambda: (
                raw.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()
                == (1,)
            ),
            what="the group's insert waiting on the other transaction",
        )
        other.commit()
        writer.join(timeout=30)
    (rows,) = result
    assert [(r["ord"], r["scheduled"], r["item_key"], r["enqueued_by"]) for r in rows] == [
        (0, "created", "y", "app"),
        (1, "conflict", "x", "other"),
    ]
    assert statements == ["schedule_events"]
    assert raw.execute(
        "SELECT item_key, count(*) FROM tickler_event WHERE queue = %s GROUP BY 1 ORDER BY 1", [queue.name]
    ).fetchall() == [("x", 1), ("y", 1)]
    assert raw.execute(
        "SELECT item_key, action FROM tickler_timeline WHERE queue = %s ORDER BY id", [queue.name]
    ).fetchall() == [("y", "enqueued")]


def batch(store: Store, queue: Queue, mode: str, items: list[NewEvent], now: datetime, **kw: Any) -> Any:
    """A batch's results as (item_key, outcome, id), or (error class, sqlstate)."""
    try:
        results = store.events.schedule_batch(queue, items, actor="app", on_conflict=mode, now=now, **kw)
    except Exception as error:
        original = getattr(error, "orig", error)
        return (type(error).__name__, getattr(original, "sqlstate", None))
    return [(r.item_key, str(r.outcome), r.id) for r in results]


def test_a_batch_under_every_on_conflict_in_one_statement(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], statements: list[str]
) -> None:
    queue = make_queue("schedule_batch", max_attempts=4, lease_seconds=60)
    at = [T0 + timedelta(seconds=10 * n) for n in range(10)]
    full = NewEvent("a", {"n": 1, "text": 'tab\there \\ "q" é'}, group_key="g1", max_attempts=5, priority=2,
                    fairness_key="f1", schedule_on=datetime(2030, 1, 1, 10, tzinfo=UTC))  # fmt: skip
    first = batch(store, queue, "reject", [full, NewEvent("b", {}, delay_seconds=60), NewEvent("c", {})], at[0])
    assert [o for _, o, _ in first] == ["created"] * 3
    ids = {key: id_ for key, _, id_ in first}
    assert batch(store, queue, "reject", [NewEvent("a", {}), NewEvent("d", {}, delay_seconds=1.5)], at[1]) == [
        ("a", "rejected", ids["a"]),
        ("d", "created", ids["c"] + 2),  # the attempt at `a` took an id
    ]
    ignored = batch(store, queue, "ignore", [NewEvent("a", {}), NewEvent("e", {"big": 2**70})], at[2])
    assert [(k, o) for k, o, _ in ignored] == [("a", "ignored"), ("e", "created")] and ignored[0][2] == ids["a"]
    replaced = batch(store, queue, "replace", [NewEvent("a", {"n": 2}, delay_seconds=30), NewEvent("f", {})], at[3])
    assert [(k, o) for k, o, _ in replaced] == [("a", "replaced"), ("f", "created")] and replaced[0][2] == ids["a"]
    a = store.events.get(queue.name, "a")
    # replace: what the item says, the defaults for the rest
    assert (a.version, a.data, a.group_key, a.max_attempts, a.priority, a.fairness_key) == (
        2,
        {"n": 2},
        None,
        4,
        0,
        None,
    )
    assert a.schedule_on == at[3] + timedelta(seconds=30)
    debounced = batch(
        store, queue, "debounce", [NewEvent("b", {"m": [1]}, delay_seconds=600), NewEvent("g", {})], at[4],
        debounce_max_seconds=30,
    )  # fmt: skip
    assert [(k, o) for k, o, _ in debounced] == [("b", "debounced"), ("g", "created")]
    b = store.events.get(queue.name, "b")
    assert (b.version, b.data, b.schedule_on) == (2, {"m": [1]}, T0 + timedelta(seconds=30))  # capped
    assert [(e.action, e.details) for e in store.events.timeline(queue.name, "b")] == [
        ("enqueued", {"max_attempts": 4}),
        ("debounced", {"max_attempts": 4, "previous_schedule_on": "2030-01-01T09:01:00Z"}),
    ]

    # in flight: refused, as a single call is (409), and left as it is
    (lease,) = store.leases.claim(queue, worker="w", limit=1, now=at[5])
    assert [e.item_key for e in lease.events] == ["c"]
    for mode in ("replace", "debounce"):
        refused = batch(store, queue, mode, [NewEvent("c", {"x": 1}), NewEvent(f"h-{mode}", {})], at[6])
        assert [(k, o) for k, o, _ in refused] == [("c", "rejected"), (f"h-{mode}", "created")]
        with pytest.raises(InFlight):
            store.events.schedule(queue, NewEvent("c", {"x": 1}), actor="app", on_conflict=mode, now=at[6])
    assert store.events.get(queue.name, "c").version == 2  # its claim's, no more
    # a lease whose time is up is ended first, then its event is replaced
    later = at[5] + timedelta(seconds=61)
    assert [o for _, o, _ in batch(store, queue, "replace", [NewEvent("c", {"x": 2})], later)] == ["replaced"]
    c = store.events.get(queue.name, "c", now=later)
    assert (c.data, c.redeliver_count, c.status) == ({"x": 2}, 1, "pending")
    assert [e.action for e in store.events.timeline(queue.name, "c")] == [
        "enqueued", "claimed", "lease_expired", "replaced",
    ]  # fmt: skip

    # trace contexts are kept with the events written, by position
    traced = TraceContext(TRACE, "k=v")
    batch(store, queue, "replace", [NewEvent("d", {}), NewEvent("e", {})], at[7], traces=[None, traced])
    assert store.events.get(queue.name, "d").traceparent is None
    e = store.events.get(queue.name, "e")
    assert (e.traceparent, e.tracestate, e.version) == (TRACE, "k=v", 2)

    # errors: nothing of the batch is written
    before = state(raw, queue.name)
    assert batch(store, queue, "reject", [NewEvent("k", {}), NewEvent("k", {"n": 2})], at[8]) == (
        "OperationalError", "40001",  # a key twice: its second item is never settled
    )  # fmt: skip
    assert batch(store, queue, "reject", [NewEvent("o1", {}), NewEvent("o2", {}, max_attempts=0)], at[8]) == (
        "IntegrityError", "23514",
    )  # fmt: skip
    assert batch(store, queue, "reject", [NewEvent("p1", {}), NewEvent("p2", {}, priority=99999)], at[8]) == (
        "DataError", "22003",
    )  # fmt: skip
    gone = replace(queue, name="schedule_batch_gone")
    assert batch(store, gone, "reject", [NewEvent("q1", {})], at[8]) == ("IntegrityError", "23503")
    assert batch(store, queue, "sometimes", [NewEvent("q1", {})], at[8])[0] == "ProgrammingError"  # raised: P0001
    assert state(raw, queue.name) == before
    assert batch(store, queue, "reject", [], at[8]) == []
    assert statements.count("schedule_batch") == 15  # one statement per batch, errors and all


def test_a_large_grouped_batch_answers_every_item_in_order(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("schedule_large")
    many = [
        NewEvent(f"n{i}", {"i": i}, group_key=f"g{i % 7}" if i % 3 else None, delay_seconds=i) for i in range(2_500)
    ]
    assert [o for _, o, _ in batch(store, queue, "reject", many[:2_000], T0)] == ["created"] * 2_000
    ignored = batch(store, queue, "ignore", many[1_500:], T0)
    assert [k for k, _, _ in ignored] == [e.item_key for e in many[1_500:]]
    assert [o for _, o, _ in ignored] == ["ignored"] * 500 + ["created"] * 500
    debounced = batch(store, queue, "debounce", many[::2], T0 + timedelta(seconds=1), debounce_max_seconds=100)
    assert {o for _, o, _ in debounced} == {"debounced"}
    replaced = batch(store, queue, "replace", many[::3], T0 + timedelta(seconds=2))
    assert {o for _, o, _ in replaced} == {"replaced"}
    assert dict(state(raw, queue.name)["counts"]) == {"open": 2_500}
    (entries,) = raw.execute("SELECT count(*) FROM tickler_timeline WHERE queue = %s", [queue.name]).fetchone() or [0]
    assert entries == 2_500 + 1_250 + 834


def test_one_replace_or_debounce_changes_its_event_in_one_statement(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], statements: list[str]
) -> None:
    queue = make_queue("schedule_one_change", max_attempts=4)
    first, _ = store.events.schedule(queue, NewEvent("a", {"n": 1}, priority=3), actor="app", now=T0)
    replaced, result = store.events.schedule(
        queue,
        NewEvent("a", {"n": 2}, delay_seconds=30, group_key="g1"),
        actor="app",
        on_conflict="replace",
        now=T0 + timedelta(seconds=10),
        trace=TraceContext(TRACE, "k=v"),
    )
    assert result == "replaced" and replaced.id == first.id and replaced.version == 2
    assert (replaced.data, replaced.group_key, replaced.priority, replaced.max_attempts) == ({"n": 2}, "g1", 0, 4)
    assert replaced.schedule_on == T0 + timedelta(seconds=40)
    debounced, result = store.events.schedule(
        queue,
        NewEvent("a", {"n": 3}, delay_seconds=600),
        actor="app",
        on_conflict="debounce",
        now=T0 + timedelta(seconds=20),
        debounce_max_seconds=300,
    )
    assert result == "debounced" and debounced.id == first.id and debounced.version == 3
    assert debounced.schedule_on == T0 + timedelta(seconds=300)  # never later than enqueued_on + the max
    assert (debounced.data, debounced.group_key) == ({"n": 3}, None)
    # a key with its open event inserts nothing: the next event takes the next id
    created, _ = store.events.schedule(queue, NewEvent("b", {}), actor="app", now=T0)
    assert created.id == first.id + 1
    traced = raw.execute("SELECT traceparent, tracestate FROM tickler_event WHERE id = %s", [first.id]).fetchone()
    assert traced == (TRACE, "k=v")
    written = state(raw, queue.name)
    assert [(key, action) for key, _, action, _, _ in written["timeline"]] == [
        ("a", "enqueued"),
        ("a", "replaced"),
        ("a", "debounced"),
        ("b", "enqueued"),
    ]
    assert written["timeline"][2][4]["previous_schedule_on"] == "2030-01-01T09:00:40Z"
    assert dict(written["counts"]) == {"open": 2}
    assert statements == ["schedule_events"] * 4
