"""One new event in one plain statement (scheduler/queries.sql, schedule_new) against
tickler_schedule().

EventStore.schedule() writes a single event under reject or ignore with schedule_new (a taken
key: it answers the open event) and asks tickler_schedule() only when that answers nothing (no
such queue, or a key taken by an event committed after the statement began). The same
calls run on two queues: one with schedule_new, one with it turned off (every call through
tickler_schedule(), as before it). Results, events, timeline entries, counts, errors and the
wake-up NOTIFY must be the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

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
    names = {driver_sql(name): name for name in ("schedule_new", "schedule_group", "schedule_group_traced")}
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
