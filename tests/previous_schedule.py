"""The store's schedule statements as the releases before tickler_schedule_events() ran them, for
tests that write into a database of an earlier release before they upgrade it."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tickler.scheduler import db
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import base as store_base

# Events scheduled in a database of an earlier release go through its tickler_schedule(jsonb), as
# that release wrote them: this release's tickler_schedule_events() is not there before the upgrade.
THIS_RELEASE_SCHEDULE = (
    "tickler_schedule_events(text, text, text, timestamptz, double precision, boolean, text[], text[],"
    " timestamptz[], double precision[], jsonb[], integer[], smallint[], text[], text[], text[])"
)
PREVIOUS_SCHEDULE_EVENTS = """
SELECT r.ord, r.outcome AS scheduled, (r.event).*,
       tickler_status((r.event).outcome, (r.event).lease_expires_on, coalesce(%(now)s::timestamptz, now())) AS status
FROM tickler_schedule(%(queue)s, %(events)s::jsonb, %(actor)s, %(on_conflict)s, %(now)s::timestamptz,
                      %(debounce_max_seconds)s::double precision, true) AS r"""
PREVIOUS_SCHEDULE_BATCH = """
SELECT r.item_key, r.outcome, r.id
FROM tickler_schedule(%(queue)s, %(events)s::jsonb, %(actor)s, %(on_conflict)s, %(now)s::timestamptz,
                      %(debounce_max_seconds)s::double precision) AS r"""


def schedule_as_earlier_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's schedule statements, in a database that has no tickler_schedule_events() yet,
    run as the earlier releases ran them."""
    real = db.driver_rows
    statements = {
        driver_sql("schedule_events"): PREVIOUS_SCHEDULE_EVENTS,
        driver_sql("schedule_batch"): PREVIOUS_SCHEDULE_BATCH,
    }

    def rows(engine: sa.Engine, statement: str, params: Any = None, *, tuples: bool = False) -> list[Any]:
        if statement not in statements:
            return real(engine, statement, params, tuples=tuples)
        (exists,) = real(
            engine, "SELECT to_regprocedure(%(name)s) IS NOT NULL", {"name": THIS_RELEASE_SCHEDULE}, tuples=True
        )[0]
        if exists:
            return real(engine, statement, params, tuples=tuples)
        fields = (
            "item_key",
            "group_key",
            "schedule_on",
            "delay_seconds",
            "data",
            "max_attempts",
            "priority",
            "fairness_key",
        )
        events = []
        columns = {**params, "data": params["data"].obj}  # one JSON array of the data
        for n, values in enumerate(zip(*(columns[name] for name in fields), strict=True)):
            item = dict(zip(fields, values, strict=True), ord=n)
            item["schedule_on"] = format_timestamp(item["schedule_on"])
            events.append(item)
        args = {name: params[name] for name in ("queue", "actor", "on_conflict", "now", "debounce_max_seconds")}
        return real(engine, statements[statement], {**args, "events": json.dumps(events)}, tuples=tuples)

    monkeypatch.setattr(store_base, "driver_rows", rows)
    without_changed_on_until_0079(monkeypatch)


# This release's statements that write or read tickler_event.changed_on (migration 0079), as an
# earlier schema takes them: without it (a search reads enqueued_on in its place).
_CHANGED_ON = (
    (re.compile(r",\s*changed_on = (clock\.now|v_now|\$10)"), ""),
    (re.compile(r", version, changed_on\)"), ", version)"),
    (re.compile(r"r\.version \+ 1,\s*clock\.now\n"), "r.version + 1\n"),
    (re.compile(r"\btickler_event\.changed_on\b"), "tickler_event.enqueued_on"),
)


def without_changed_on_until_0079(monkeypatch: pytest.MonkeyPatch) -> None:
    """Statements that name changed_on, sent to a database that has no such column yet, go
    without it (a test that fills an earlier release's database with this release's store)."""
    real = psycopg.Cursor.execute

    def execute(cursor: psycopg.Cursor[Any], query: Any, params: Any = None, **options: Any) -> Any:
        if isinstance(query, str) and "changed_on" in query and not query.lstrip().startswith(("ALTER", "COMMENT")):
            with cursor.connection.cursor() as probe:
                real(
                    probe,
                    "SELECT to_regclass('tickler_event') IS NULL OR EXISTS (SELECT 1 FROM pg_attribute"
                    " WHERE attrelid = 'tickler_event'::regclass AND attname = 'changed_on')",
                )
                found = probe.fetchone()
            if found is not None and not found[0]:
                for pattern, replacement in _CHANGED_ON:
                    query = pattern.sub(replacement, query)
        return real(cursor, query, params, **options)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
