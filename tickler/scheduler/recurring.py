"""The engine of recurring schedules: enqueue each occurrence as an ordinary event, exactly once.

Every dispatcher (`tickler serve`, `tickler worker`) calls enqueue_due() every few seconds, and a
schedule's PUT calls advance() for it at once. A schedule's row is locked while it is advanced
and its cursor (`enqueued_through`) moves in the same transaction as the events are inserted, so
however many processes run, each occurrence is decided once: enqueued, or skipped by catch_up.

Between runs a schedule's next future occurrence always waits as a pending event; when it comes
due (`due_on`), the run after enqueues the one after it. After downtime (no run while several
occurrences came due), `catch_up` says which of the missed ones are enqueued late:
`latest` the most recent, `none` none, `all` all of them up to MAX_CATCH_UP (the most recent ones).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
import structlog

from tickler.scheduler import cron, tracing
from tickler.scheduler.db import driver_connection
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.sql import driver_sql, run
from tickler.scheduler.tracing import TraceContext

log = structlog.get_logger(__name__)

CATCH_UP_CHOICES = ("latest", "none", "all")
# catch_up "all" enqueues at most this many missed occurrences (the most recent), so that a
# minutely schedule after a month of downtime does not flood its queue with 43,200 events.
MAX_CATCH_UP = 1000
# Schedules locked and advanced per transaction by enqueue_due().
BATCH = 100
# Windows (back from now) searched for the most recent missed occurrences: cron runs forwards only.
_LOOK_BACK = (timedelta(hours=1), timedelta(days=1), timedelta(days=32), timedelta(days=367), cron.HORIZON)
# A schedule whose stored expression no longer parses (a time zone gone from tzdata) is looked at
# again this much later, instead of failing every run.
_RETRY_BROKEN = timedelta(hours=1)
# A schedule's row as lock_due_schedules and lock_schedule return it (with `db_now`), by column name.
Schedule = Mapping[str, Any]


def actor(schedule_key: str) -> str:
    """`enqueued_by` of a schedule's occurrences."""
    return f"schedule:{schedule_key}"


def occurrence_key(schedule_key: str, occurrence: datetime) -> str:
    """`{schedule_key}@2026-11-23T08:00:00Z`: the item_key of one occurrence."""
    return f"{schedule_key}@{occurrence.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def missed(expression: cron.Cron, after: datetime, until: datetime, n: int) -> list[datetime]:
    """The last `n` (at most) occurrences in (after, until], oldest first."""
    for window in _LOOK_BACK:
        start = max(after, until - window)
        found = []
        for occurrence in expression.after(start):
            if occurrence > until:
                break
            found.append(occurrence)
        if len(found) >= n or start == after:
            return found[-n:] if n else []
    return found[-n:]


def advance(conn: psycopg.Connection[Any], schedule: Schedule, *, now: datetime | None) -> int:
    """Enqueue what a locked schedule owes at `schedule["db_now"]` and move its cursor; return
    how many events were inserted. `now` is passed on to the inserts (None: database clock)."""
    at: datetime = schedule["db_now"]
    key = schedule["schedule_key"]
    try:
        expression = cron.parse(schedule["cron"], schedule["timezone"])
    except ValueError as error:
        log.warning("schedule_unparsable", queue=schedule["queue"], schedule_key=key, error=str(error))
        _move(conn, schedule, through=schedule["enqueued_through"], due_on=at + _RETRY_BROKEN, last=None)
        return 0
    through = schedule["enqueued_through"]
    late: list[datetime] = []
    if through is not None and schedule["catch_up"] != "none":
        limit = 1 if schedule["catch_up"] == "latest" else MAX_CATCH_UP
        late = missed(expression, through, at, limit)
    upcoming = expression.next(at, 1)
    occurrences = late + upcoming
    inserted = _enqueue(conn, schedule, occurrences, now=now)
    if upcoming:
        _move(conn, schedule, through=upcoming[0], due_on=upcoming[0], last=occurrences[-1])
    else:  # it fires no more (a date that has passed): nothing will ever be due
        _move(conn, schedule, through=at, due_on=datetime.max.replace(tzinfo=UTC), last=late[-1] if late else None)
    return inserted


def _enqueue(
    conn: psycopg.Connection[Any], schedule: Schedule, occurrences: list[datetime], *, now: datetime | None
) -> int:
    if not occurrences:
        return 0
    key = schedule["schedule_key"]
    events = [
        {
            "ord": n,
            "item_key": occurrence_key(key, occurrence),
            "group_key": schedule["group_key"],
            "schedule_on": format_timestamp(occurrence),
            "delay_seconds": None,
            "data": schedule["data"],
            "max_attempts": None,
            "priority": schedule.get("priority", 0),
            "fairness_key": schedule.get("fairness_key"),
        }
        for n, occurrence in enumerate(occurrences)
    ]
    rows = run(
        conn,
        driver_sql("schedule_many"),  # the one write path (tickler_schedule), like the API's batch
        {
            "queue": schedule["queue"],
            "events": json.dumps(events, separators=(",", ":")),
            "actor": actor(key),
            "on_conflict": "reject",
            "now": now,
            "debounce_max_seconds": None,
        },
    )
    if tracing.enabled():
        _trace_occurrences(conn, schedule, [row for row in rows if row["outcome"] == "created"])
    # A key already open (someone scheduled that exact key by hand) keeps its event.
    return sum(1 for row in rows if row["outcome"] == "created")


def _trace_occurrences(conn: psycopg.Connection[Any], schedule: Schedule, created: list[dict[str, Any]]) -> None:
    """Each occurrence starts a trace of its own (a `create` span), linked to the schedule's last
    change; the event keeps that span's context, as an event scheduled over HTTP keeps its own."""
    change = TraceContext.parse(schedule.get("traceparent"), schedule.get("tracestate"))
    ids, traces = [], []
    for row in created:
        with tracing.span(
            "create",
            schedule["queue"],
            root=True,
            links=[change],
            messaging__message__id=str(row["id"]),
            tickler__item_key=row["item_key"],
            tickler__schedule_key=schedule["schedule_key"],
        ) as span:
            if span.context is not None:
                ids.append(row["id"])
                traces.append(span.context)
    if ids:
        run(
            conn,
            driver_sql("set_trace_context"),
            {
                "ids": ids,
                "traceparents": [t.traceparent for t in traces],
                "tracestates": [t.tracestate for t in traces],
            },
        )


def _move(
    conn: psycopg.Connection[Any],
    schedule: Schedule,
    *,
    through: datetime | None,
    due_on: datetime,
    last: datetime | None,
) -> None:
    run(
        conn,
        driver_sql("advance_schedule"),
        {
            "queue": schedule["queue"],
            "schedule_key": schedule["schedule_key"],
            "enqueued_through": through,
            "due_on": due_on,
            "last_enqueued": last,
        },
    )


def enqueue_due(engine: sa.Engine, *, now: datetime | None = None, batch: int = BATCH) -> int:
    """Advance every schedule that has work due at `now` (None: the database clock); return how
    many events were enqueued. Safe to run in any number of processes at once."""
    total = 0
    while True:
        params = {"now": now, "limit": batch}
        with driver_connection(engine, driver_sql("lock_due_schedules"), params) as conn:
            rows = run(conn, driver_sql("lock_due_schedules"), params)
            for row in rows:
                total += advance(conn, row, now=now)
        if len(rows) < batch:
            return total


# How often every dispatcher runs enqueue_due(). The next occurrence of a schedule is enqueued
# ahead of time, so this only has to be well under the shortest cron period (one minute).
INTERVAL_SECONDS = 5.0


def periodic(engine: sa.Engine) -> Callable[[], None]:
    """The dispatcher's periodic job: enqueue_due(), logging (not raising) database trouble."""

    def run() -> None:
        try:
            enqueued = enqueue_due(engine)
        except sa.exc.DBAPIError as error:
            # A deadlock with a queue being deleted, the database restarting...: the next run retries.
            log.warning("recurring_schedules_failed", error=str(error).splitlines()[0])
            return
        if enqueued:
            log.info("recurring_occurrences_enqueued", events=enqueued)

    return run
