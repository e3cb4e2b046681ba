"""scheduler.states names exactly the values the schema allows."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from tickler.scheduler.states import ALL_STATUSES, OPEN_STATUSES, OUTCOMES, Action, Status


def _check_literals(raw: psycopg.Connection[Any], constraint: str) -> set[str]:
    found = raw.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s", [constraint]
    ).fetchone()
    assert found is not None, constraint
    return set(re.findall(r"'([a-z_]+)'::text", found[0]))


def test_actions_are_the_timeline_check_list(raw: psycopg.Connection[Any]) -> None:
    assert _check_literals(raw, "tickler_timeline_action_check") == {a.value for a in Action}


def test_outcomes_are_the_event_check_list(raw: psycopg.Connection[Any]) -> None:
    assert _check_literals(raw, "outcome_known") == {s.value for s in OUTCOMES}
    # the trigger-kept counters count the open events and each outcome
    counted = _check_literals(raw, "tickler_queue_count_state_check")
    assert counted == {"open"} | {s.value for s in OUTCOMES}


def test_open_statuses_are_what_tickler_status_computes(raw: psycopg.Connection[Any]) -> None:
    rows = raw.execute(
        "SELECT tickler_status(NULL, NULL, now()), tickler_status(NULL, now() - interval '1 s', now()),"
        " tickler_status(NULL, now() + interval '1 s', now())"
    ).fetchone()
    assert rows == (Status.PENDING, Status.PENDING, Status.IN_FLIGHT)
    assert {rows[0], rows[2]} == OPEN_STATUSES
    for outcome in OUTCOMES:
        assert raw.execute("SELECT tickler_status(%s, NULL, now())", [outcome.value]).fetchone() == (outcome,)
    assert set(Status) == ALL_STATUSES
