"""The schema itself refuses what must never be: two open events per key, impossible states,
rewritten history. These use raw SQL, as a buggy worker or a careless operator would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest

from tickler.scheduler.db import libpq_url


@pytest.fixture
def conn(database_url: str, raw: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    raw.execute(
        "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
        " backoff_max_seconds, backoff_multiplier) VALUES ('emails', 'pull', 30, 10, 1, 60, 2)"
    )
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        yield conn


def _insert(conn: psycopg.Connection[Any], item_key: str = "k", **columns: Any) -> int:
    values = {
        "queue": "emails",
        "item_key": item_key,
        "schedule_on": "2030-01-01T00:00:00Z",
        "enqueued_by": "t",
        "max_attempts": 3,
        **columns,
    }
    names = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    row = conn.execute(f"INSERT INTO tickler_event ({names}) VALUES ({marks}) RETURNING id", list(values.values()))
    found = row.fetchone()
    assert found is not None
    return int(found[0])


def test_second_open_event_for_a_key_is_refused(conn: psycopg.Connection[Any]) -> None:
    _insert(conn)
    with pytest.raises(psycopg.errors.UniqueViolation) as refused:
        _insert(conn)
    assert refused.value.diag.constraint_name == "tickler_event_open_key"
    _insert(conn, "other")  # another key is fine


def test_a_finished_event_frees_its_key(conn: psycopg.Connection[Any]) -> None:
    first = _insert(conn)
    conn.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 't', outcome = 'delivered' WHERE id = %s", [first]
    )
    second = _insert(conn)
    assert second != first
    with pytest.raises(psycopg.errors.UniqueViolation):
        _insert(conn)
    # The finished one left the open events for the history, in the statement that finished it.
    assert conn.execute("SELECT count(*) FROM tickler_event WHERE id = %s", [first]).fetchone() == (0,)
    moved = conn.execute("SELECT outcome FROM tickler_event_history WHERE id = %s", [first]).fetchone()
    assert moved == ("delivered",)
    # Reopening the finished one (as a retry does) would make two open events: refused as well.
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO tickler_event (id, queue, item_key, schedule_on, enqueued_by, max_attempts) "
            "OVERRIDING SYSTEM VALUE SELECT id, queue, item_key, schedule_on, enqueued_by, max_attempts "
            "FROM tickler_event_history WHERE id = %s",
            [first],
        )


IMPOSSIBLE = [
    ("dequeued_by without dequeued_on", {"dequeued_by": "t"}, "finished_has_actor"),
    (
        "dequeued_on without dequeued_by",
        {"dequeued_on": "2030-01-01T00:00:00Z", "outcome": "delivered"},
        "finished_has_actor",
    ),
    ("outcome without dequeued_on", {"outcome": "delivered"}, "finished_has_outcome"),
    (
        "dequeued_on without outcome",
        {"dequeued_on": "2030-01-01T00:00:00Z", "dequeued_by": "t"},
        "finished_has_outcome",
    ),
    (
        "unknown outcome",
        {"dequeued_on": "2030-01-01T00:00:00Z", "dequeued_by": "t", "outcome": "lost"},
        "outcome_known",
    ),
    ("negative redeliver_count", {"redeliver_count": -1}, "redeliver_count_not_negative"),
    (
        "lease_id without expiry",
        {"claimed_on": "2030-01-01T00:00:00Z", "claimed_by": "w", "lease_id": "00000000-0000-0000-0000-000000000001"},
        "lease_has_expiry",
    ),
    (
        "expiry without lease_id",
        {"claimed_on": "2030-01-01T00:00:00Z", "claimed_by": "w", "lease_expires_on": "2030-01-01T00:00:00Z"},
        "lease_has_expiry",
    ),
    (
        "lease without claim",
        {"lease_id": "00000000-0000-0000-0000-000000000001", "lease_expires_on": "2030-01-01T00:00:00Z"},
        "lease_has_claim",
    ),
    ("claimed_on without claimed_by", {"claimed_on": "2030-01-01T00:00:00Z"}, "claim_has_claimer"),
    ("max_attempts 0", {"max_attempts": 0}, "max_attempts_positive"),
    ("version 0", {"version": 0}, "version_positive"),
    ("data an array", {"data": "[]"}, "data_is_object"),
]


@pytest.mark.parametrize(
    ("columns", "constraint"), [(c, n) for _, c, n in IMPOSSIBLE], ids=[i for i, _, _ in IMPOSSIBLE]
)
def test_impossible_states_are_refused(conn: psycopg.Connection[Any], columns: dict[str, Any], constraint: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        _insert(conn, **columns)
    assert refused.value.diag.constraint_name == constraint


@pytest.mark.parametrize("item_key", ["", "a/b", "k" * 256])
def test_bad_keys_are_refused_by_the_schema(conn: psycopg.Connection[Any], item_key: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        _insert(conn, item_key)
    assert refused.value.diag.constraint_name == "item_key_syntax"


def test_impossible_updates_are_refused(conn: psycopg.Connection[Any]) -> None:
    event = _insert(conn)
    for assignment in (
        "dequeued_by = 'x'",
        "outcome = 'dead'",
        "redeliver_count = -1",
        "claimed_on = now(), claimed_by = 'w', lease_id = gen_random_uuid()",
    ):
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"UPDATE tickler_event SET {assignment} WHERE id = %s", [event])


def test_timeline_is_append_only(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO tickler_timeline (queue, item_key, event_id, action, actor)"
        " VALUES ('emails', 'k', 1, 'enqueued', 't')"
    )
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("UPDATE tickler_timeline SET actor = 'mallory'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("DELETE FROM tickler_timeline")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("TRUNCATE tickler_timeline")
    assert conn.execute("SELECT actor FROM tickler_timeline").fetchall() == [("t",)]


def test_timeline_refuses_unknown_actions(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO tickler_timeline (queue, item_key, event_id, action, actor)"
            " VALUES ('emails', 'k', 1, 'x', 't')"
        )
