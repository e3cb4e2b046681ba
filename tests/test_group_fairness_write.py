"""A group's one fairness key, settled for a whole write: tickler_schedule_events() tells the
per-row trigger (tickler_check_group_fairness) that it has nothing to refuse when the queue's groups
never had a key, or when one look per group settles it -- and every write the trigger refused
before is still refused, whichever way it is settled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tickler.scheduler.db import libpq_url
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.states import OnConflict, Scheduled
from tickler.scheduler.store import Store


def refused(error: BaseException) -> bool:
    """The trigger's refusal, however the store's driver wraps it."""
    cause: BaseException | None = error
    while cause is not None:
        if getattr(getattr(cause, "diag", None), "constraint_name", None) == "tickler_event_group_fairness":
            return True
        cause = getattr(cause, "orig", None) or cause.__cause__
    return False


def grouped_fairness(raw: psycopg.Connection[Any], queue: str) -> bool:
    row = raw.execute("SELECT grouped_fairness FROM tickler_queue WHERE name = %s", (queue,)).fetchone()
    assert row is not None
    return bool(row[0])


def open_keys(raw: psycopg.Connection[Any], queue: str) -> list[tuple[str, str | None, str]]:
    rows = raw.execute(
        "SELECT item_key, group_key, fairness_key FROM tickler_event WHERE queue = %s ORDER BY item_key", (queue,)
    )
    return [(k, g, f) for k, g, f in rows]


def test_groups_without_keys_are_written_and_a_key_into_them_is_still_refused(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    results = store.events.schedule_batch(
        queue, [NewEvent(f"k{i}", {}, group_key=f"g{i % 3}") for i in range(9)], actor="app"
    )
    assert [r.outcome for r in results] == [Scheduled.CREATED] * 9
    assert not grouped_fairness(raw, "emails")  # no grouped event had a key: the queue says so

    with pytest.raises(Exception) as batch:
        store.events.schedule_batch(
            queue,
            [NewEvent("x1", {}, group_key="new"), NewEvent("x2", {}, group_key="g1", fairness_key="t")],
            actor="app",
        )
    assert refused(batch.value)
    with pytest.raises(Exception) as single:
        store.events.schedule(queue, NewEvent("x3", {}, group_key="g2", fairness_key="t"), actor="app")
    assert refused(single.value)
    assert len(open_keys(raw, "emails")) == 9  # nothing of either call was written
    assert not grouped_fairness(raw, "emails")


def test_a_group_with_a_key_sets_the_queue_flag_and_refuses_the_empty_key(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    store.events.schedule_batch(
        queue, [NewEvent(f"t{i}", {}, group_key="tenant", fairness_key="a") for i in range(3)], actor="app"
    )
    assert grouped_fairness(raw, "emails")
    # an empty key into the keyed group: refused, by a batch and by a single event
    with pytest.raises(Exception) as batch:
        store.events.schedule_batch(
            queue, [NewEvent("e1", {}, group_key="plain"), NewEvent("e2", {}, group_key="tenant")], actor="app"
        )
    assert refused(batch.value)
    with pytest.raises(Exception) as single:
        store.events.schedule(queue, NewEvent("e3", {}, group_key="tenant"), actor="app")
    assert refused(single.value)
    # the same key, and other groups, are fine; an ignored key is ignored
    results = store.events.schedule_batch(
        queue,
        [
            NewEvent("t0", {}, group_key="tenant", fairness_key="a"),
            NewEvent("t9", {}, group_key="tenant", fairness_key="a"),
            NewEvent("p1", {}, group_key="plain"),
        ],
        actor="app",
        on_conflict=OnConflict.IGNORE,
    )
    assert [r.outcome for r in results] == [Scheduled.IGNORED, Scheduled.CREATED, Scheduled.CREATED]


def test_items_of_one_group_with_two_keys_are_refused(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    with pytest.raises(Exception) as batch:
        store.events.schedule_batch(
            queue,
            [NewEvent("a", {}, group_key="g", fairness_key="x"), NewEvent("b", {}, group_key="g", fairness_key="y")],
            actor="app",
        )
    assert refused(batch.value)
    assert open_keys(raw, "emails") == []
    assert not grouped_fairness(raw, "emails")  # the refused call set nothing


def test_a_debounce_that_brings_a_key_into_a_group_refuses_the_empty_key_beside_it(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    store.events.schedule(queue, NewEvent("keyed", {}, fairness_key="x"), actor="app")  # no group yet
    with pytest.raises(Exception) as batch:
        # debounce keeps the key it is not given: "keyed" moves into g with x, then "new" comes with none
        store.events.schedule_batch(
            queue,
            [NewEvent("keyed", {}, group_key="g"), NewEvent("new", {}, group_key="g")],
            actor="app",
            on_conflict=OnConflict.DEBOUNCE,
        )
    assert refused(batch.value)
    assert open_keys(raw, "emails") == [("keyed", None, "x")]


def test_the_trigger_is_told_for_one_statement_only(
    store: Store, make_queue: Callable[..., Queue], database_url: str
) -> None:
    make_queue("emails")
    with psycopg.connect(libpq_url(database_url)) as conn:  # one transaction for both statements
        conn.execute(
            "SELECT * FROM tickler_schedule_events('emails', 'app', 'reject', NULL, NULL, false, %s, %s,"
            " NULL, NULL, %s, NULL, NULL, NULL, NULL, NULL)",
            (["a", "b"], ["g", "g"], [psycopg.types.json.Jsonb({}), psycopg.types.json.Jsonb({})]),
        )
        setting = conn.execute("SELECT current_setting('tickler.group_fairness_checked', true)").fetchone()
        assert setting is not None and setting[0] != "on"
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO tickler_event (queue, item_key, group_key, schedule_on, enqueued_by, max_attempts,"
                " fairness_key) VALUES ('emails', 'c', 'g', now(), 'app', 1, 'other')"
            )
