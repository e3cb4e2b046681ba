"""One new event in one plain statement (scheduler/queries.sql, schedule_new), and the new events
of one group commit in one (schedule_new_many), against tickler_schedule().

EventStore.schedule() writes a single event under reject or ignore with schedule_new (a taken
key: it answers the open event) and asks tickler_schedule() only when that answers nothing (no
such queue, or a key taken by an event committed after the statement began). The same
calls run on two queues: one with schedule_new, one with it turned off (every call through
tickler_schedule(), as before it). Results, events, timeline entries, counts, errors and the
wake-up NOTIFY must be the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tickler.scheduler.errors import KeyConflict
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import Store
from tickler.scheduler.store import events as event_store
from tickler.scheduler.tracing import TraceContext

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the statements EventStore ran (schedule_new, schedule_group), in order."""
    names = {
        driver_sql(name): name
        for name in ("schedule_new", "schedule_new_many", "schedule_group", "schedule_group_traced")
    }
    ran: list[str] = []
    real = event_store.driver_rows

    def spy(engine: Any, statement: str, params: dict[str, Any], **kwargs: Any) -> list[Any]:
        ran.append(names.get(statement, "other"))
        return real(engine, statement, params, **kwargs)

    monkeypatch.setattr(event_store, "driver_rows", spy)
    return ran


@pytest.fixture
def without_schedule_new(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], None]]:
    """Turn schedule_new off (True) and on again (False)."""
    modes = event_store._NEW_ONLY

    def switch(off: bool) -> None:
        monkeypatch.setattr(event_store, "_NEW_ONLY", frozenset() if off else modes)

    yield switch


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


def calls(queue: Queue, unknown: Queue) -> list[tuple[Queue, str, NewEvent, dict[str, Any]]]:
    """Every kind of single new event under reject and ignore, taken keys and errors among them."""
    at = [T0 + timedelta(seconds=10 * n) for n in range(20)]
    full = NewEvent(
        "a",
        {"n": 1, "nested": {"x": [1, 2]}},
        group_key="g1",
        schedule_on=datetime(2030, 1, 1, 10, 0, tzinfo=UTC),
        max_attempts=5,
        priority=2,
        fairness_key="f1",
    )
    return [
        (queue, "reject", full, {"now": at[0]}),  # created, every field given
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


def test_one_new_event_writes_and_answers_what_tickler_schedule_does(
    store: Store,
    make_queue: Callable[..., Queue],
    raw: psycopg.Connection[Any],
    statements: list[str],
    without_schedule_new: Callable[[bool], None],
) -> None:
    new, old = make_queue("schedule_new_on", max_attempts=4), make_queue("schedule_new_off", max_attempts=4)
    unknown = replace(new, name="schedule_new_gone")
    answers: dict[str, list[Any]] = {}
    for side, off in ((new, False), (old, True)):
        without_schedule_new(off)
        answers[side.name] = [
            outcome(store, q if q is unknown else side, mode, event, **kw)
            for q, mode, event, kw in calls(side, unknown)
        ]
    mine, theirs = answers[new.name], answers[old.name]
    for n, (one, other) in enumerate(zip(mine, theirs, strict=True)):
        if n == len(mine) - 1:  # the database's clock: different instants
            one[1].pop("schedule_on"), other[1].pop("schedule_on")
            one[1].pop("enqueued_on"), other[1].pop("enqueued_on")
        assert one == other, f"call {n}"
    assert [a[0] for a in mine] == [
        "created", "KeyConflict", "ignored", "created", "created", "created", "IntegrityError", "IntegrityError",
        "DataError", "IntegrityError", "IntegrityError", "created", "created",
    ], mine  # fmt: skip
    assert mine[0][1]["schedule_on"] == datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    assert mine[3][1]["schedule_on"] == T0 + timedelta(seconds=30, milliseconds=60_500)
    assert mine[11][1]["traceparent"] == TRACE
    assert state(raw, new.name) == state(raw, old.name)

    # with it on, every call took one statement but the unknown queue's, which went on to
    # tickler_schedule() for its error, and the traced one (errors of the statement itself are final)
    ran_on = statements[: len(statements) - len(theirs)]
    assert ran_on == ["schedule_new"] * 11 + ["schedule_group", "schedule_group_traced", "schedule_new"], ran_on
    assert set(statements[len(ran_on) :]) == {"schedule_group", "schedule_group_traced"}


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
    assert statements == ["schedule_new", "schedule_new"]


def group_answers(store: Store, queue: Queue, mode: str, events: list[NewEvent], now: datetime) -> Any:
    """What a group commit's write answers per item (scheduled, the event without its id), or the
    error it raises (then the group's items are written alone: the same on both sides)."""
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
                NewEvent(
                    "d",
                    {"n": 2, "nested": {"x": [1, 2]}},
                    group_key="g1",
                    schedule_on=datetime(2030, 1, 1, 10, 0, tzinfo=UTC),
                    max_attempts=5,
                    priority=2,
                    fairness_key="f1",
                ),
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


def test_a_group_of_new_events_writes_and_answers_what_tickler_schedule_does(
    store: Store,
    make_queue: Callable[..., Queue],
    raw: psycopg.Connection[Any],
    statements: list[str],
    without_schedule_new: Callable[[bool], None],
) -> None:
    new, old = make_queue("schedule_many_on", max_attempts=4), make_queue("schedule_many_off", max_attempts=4)
    unknown = replace(new, name="schedule_many_gone")
    answers: dict[str, list[Any]] = {}
    for side, off in ((new, False), (old, True)):
        without_schedule_new(off)
        answers[side.name] = [
            group_answers(store, q if q is unknown else side, mode, events, T0 + timedelta(seconds=10 * n))
            for n, (q, mode, events) in enumerate(groups(side, unknown))
        ]
    mine, theirs = answers[new.name], answers[old.name]
    for n, (one, other) in enumerate(zip(mine, theirs, strict=True)):
        assert one == other, f"group {n}"
    outcomes = [a if isinstance(a, tuple) else [row["scheduled"] for row in a] for a in mine]
    assert outcomes == [
        ["created", "created", "created"],
        ["created", "conflict", "created"],
        ["conflict", "created", "conflict"],
        ("IntegrityError", "23514"),
        ("IntegrityError", "23514"),
        ("IntegrityError", "23503"),
        ["created", "created"],
    ], outcomes
    assert state(raw, new.name) == state(raw, old.name)
    # with it on, each group was one statement; the refused ones raised from it, and the unknown
    # queue's (no row at all) went on to tickler_schedule() for its error
    ran_on = statements[: len(statements) - len(theirs)]
    assert ran_on == ["schedule_new_many"] * 6 + ["schedule_group", "schedule_new_many"], ran_on


def test_a_key_taken_while_the_group_is_written_is_answered_by_tickler_schedule(
    store: Store,
    make_queue: Callable[..., Queue],
    database_url: str,
    raw: psycopg.Connection[Any],
    statements: list[str],
) -> None:
    """An item whose key an event took after the group's statement began (its insert waited on
    that event's transaction, then gave way): the statement answers nothing for it, and
    tickler_schedule() answers the conflict; the group's other items stay written once."""
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
    assert statements == ["schedule_new_many", "schedule_group"]
    assert raw.execute(
        "SELECT item_key, count(*) FROM tickler_event WHERE queue = %s GROUP BY 1 ORDER BY 1", [queue.name]
    ).fetchall() == [("x", 1), ("y", 1)]
    assert raw.execute(
        "SELECT item_key, action FROM tickler_timeline WHERE queue = %s ORDER BY id", [queue.name]
    ).fetchall() == [("y", "enqueued")]
