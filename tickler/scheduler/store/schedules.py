"""Recurring schedules by key: create or change (PUT), read, list, delete.

What a change does to the occurrence already waiting as an event (`{key}@{time}`):
* same next time under the new cron: the waiting event stays and takes the new data and group
  (timeline `updated`); if it was cancelled to skip it, it stays skipped;
* another next time (cron or time zone changed): the waiting event is cancelled (reason
  `schedule updated`) and the new next occurrence is enqueued at once;
* paused: the waiting event is cancelled (reason `schedule paused`) and nothing is enqueued while
  paused; resumed: the next occurrence from now on is enqueued, missed ones are not caught up.
Occurrences that already came due are never touched: they finish like any other event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from tickler.scheduler import cron, recurring
from tickler.scheduler.db import driver_connection
from tickler.scheduler.errors import NotFound
from tickler.scheduler.rules import record_json
from tickler.scheduler.sql import driver_sql, pyformat, run
from tickler.scheduler.states import Action
from tickler.scheduler.store.base import EngineStore
from tickler.scheduler.tracing import TraceContext

# The definition of a schedule: what PUT sets and the timeline reports as changed.
FIELDS = ("cron", "timezone", "data", "group_key", "catch_up", "paused", "priority", "fairness_key")
# due_on of a schedule with work to do at once (see migrations/0010_schedules.sql).
_AT_ONCE = datetime(1970, 1, 1, tzinfo=UTC)
# A schedule's row as its statements return it (lock_schedule: with `db_now`), by column name.
Row = dict[str, Any]


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as a client asks for it, already checked (cron and time zone parse)."""

    cron: str
    timezone: str
    data: dict[str, Any]
    group_key: str | None = None
    catch_up: str = "latest"
    paused: bool = False
    # SPEC §10: carried by every occurrence
    priority: int = 0
    fairness_key: str | None = None


@dataclass(frozen=True)
class Schedule:
    queue: str
    schedule_key: str
    cron: str
    timezone: str
    data: dict[str, Any]
    group_key: str | None
    catch_up: str
    paused: bool
    last_enqueued: datetime | None
    next_occurrences: tuple[datetime, ...]
    created_on: datetime
    created_by: str
    updated_on: datetime
    updated_by: str
    version: int
    priority: int = 0
    fairness_key: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], now: datetime, upcoming: int = 5) -> Schedule:
        """`next_occurrences`: the next `upcoming` after `now`; none while paused."""
        nexts: list[datetime] = []
        if not row["paused"] and upcoming:
            try:
                nexts = cron.parse(row["cron"], row["timezone"]).next(now, upcoming)
            except ValueError:
                nexts = []  # a time zone gone from tzdata: it fires no more (recurring logs it)
        return cls(
            next_occurrences=tuple(nexts),
            **{name: row[name] for name in cls.__dataclass_fields__ if name != "next_occurrences"},
        )


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """A schedule as every tickler interface shows it (HTTP, CLI --json)."""
    return record_json(schedule, _SCHEDULE_JSON_FIELDS)


_SCHEDULE_JSON_FIELDS = (
    "queue", "schedule_key", "cron", "timezone", "data", "group_key", "catch_up", "paused", "priority",
    "fairness_key", "next_occurrences", "last_enqueued", "created_on", "created_by", "updated_on", "updated_by",
    "version",
)  # fmt: skip


class ScheduleStore(EngineStore):
    def put(
        self,
        queue: str,
        schedule_key: str,
        spec: ScheduleSpec,
        *,
        actor: str,
        now: datetime | None = None,
        trace: TraceContext | None = None,
    ) -> tuple[Schedule, bool]:
        """Create or change a schedule and enqueue its next occurrence; returns (it, created)."""
        params = {"queue": queue, "schedule_key": schedule_key, "now": now}
        with driver_connection(self.engine, driver_sql("lock_schedule"), params) as conn:
            created = False
            logged: tuple[Action, list[str]] | None = None
            rows = run(conn, driver_sql("lock_schedule"), params)
            if not rows:
                inserted = run(
                    conn, driver_sql("insert_schedule"), {**params, **_spec_params(spec, stored=True), "actor": actor}
                )
                created = bool(inserted)
                [row] = run(conn, driver_sql("lock_schedule"), params)
                if created:
                    logged = (Action.SCHEDULE_CREATED, list(FIELDS))
            else:
                row = rows[0]
            if not created:
                row, changed = self._change(conn, row, spec, actor=actor, now=now)
                if changed:
                    logged = (Action.SCHEDULE_UPDATED, changed)
            if logged is not None and (trace is not None or row.get("traceparent") is not None):
                run(
                    conn,
                    driver_sql("set_schedule_trace"),
                    {
                        **params,
                        "traceparent": trace.traceparent if trace else None,
                        "tracestate": trace.tracestate if trace else None,
                    },
                )
                [row] = run(conn, driver_sql("lock_schedule"), params)
            if not row["paused"] and row["due_on"] <= row["db_now"]:
                recurring.advance(conn, row, now=now)
            [final] = run(conn, driver_sql("lock_schedule"), params)
            if logged is not None:
                # After advance(): the entry can say when the schedule fires next.
                self._log(conn, final, logged[0], actor, now, {"changed": logged[1]}, _next_waiting(final))
            return Schedule.from_row(final, row["db_now"]), created

    def _change(
        self, conn: psycopg.Connection[Any], row: Row, spec: ScheduleSpec, *, actor: str, now: datetime | None
    ) -> tuple[Row, list[str]]:
        """Apply a PUT to a locked schedule (see the module's docstring); returns the schedule
        and the names of the fields that changed."""
        wanted = _spec_params(spec)
        changed = [name for name in FIELDS if row[name] != wanted[name]]
        if not changed:
            return row, changed
        at: datetime = row["db_now"]
        through, due_on = row["enqueued_through"], row["due_on"]
        waiting = through is not None and through > at
        if spec.paused:
            if waiting and not row["paused"]:
                self._cancel_waiting(conn, row, actor, "schedule paused", now)
            through, due_on = None, _AT_ONCE  # on resume: from then on, nothing caught up
        elif row["paused"]:
            through, due_on = None, _AT_ONCE
        elif waiting:
            upcoming = cron.parse(spec.cron, spec.timezone).next(at, 1)
            if upcoming and upcoming[0] == through:
                self._update_waiting(conn, row, spec, actor, now)
            else:
                self._cancel_waiting(conn, row, actor, "schedule updated", now)
                through, due_on = None, _AT_ONCE
        run(
            conn,
            driver_sql("update_schedule"),
            {
                "queue": row["queue"],
                "schedule_key": row["schedule_key"],
                **_spec_params(spec, stored=True),
                "enqueued_through": through,
                "due_on": due_on,
                "actor": actor,
                "now": now,
            },
        )
        params = {"queue": row["queue"], "schedule_key": row["schedule_key"], "now": now}
        [locked] = run(conn, driver_sql("lock_schedule"), params)
        return locked, changed

    def _waiting_event(self, conn: psycopg.Connection[Any], row: Row) -> Row | None:
        """The open event of the waiting occurrence, if it is still pending and the schedule's."""
        key = recurring.occurrence_key(row["schedule_key"], row["enqueued_through"])
        params = {"queue": row["queue"], "item_key": key, "now": row["db_now"]}
        rows = run(conn, driver_sql("lock_open_event"), params)
        found: Row | None = rows[0] if rows else None
        if (
            found is None
            or found["lease_id"] is not None
            or found["enqueued_by"] != recurring.actor(row["schedule_key"])
        ):
            return None
        return found

    def _cancel_waiting(
        self, conn: psycopg.Connection[Any], row: Row, actor: str, reason: str, now: datetime | None
    ) -> None:
        event = self._waiting_event(conn, row)
        if event is not None:
            params = {"queue": event["queue"], "item_key": event["item_key"], "actor": actor, "reason": reason}
            run(conn, driver_sql("cancel_event"), {**params, "now": now, "if_match": None})

    def _update_waiting(
        self, conn: psycopg.Connection[Any], row: Row, spec: ScheduleSpec, actor: str, now: datetime | None
    ) -> None:
        """The waiting occurrence takes the schedule's new data, group, priority and fairness key,
        changed as a PATCH changes an event (tickler_change_event), its entry giving the reason."""
        event = self._waiting_event(conn, row)
        if event is None:
            return
        run(
            conn,
            driver_sql("change_event"),
            {
                "queue": event["queue"],
                "item_key": event["item_key"],
                "actor": actor,
                "reason": "schedule updated",
                "now": now,
                "if_match": None,
                "schedule_on": None,
                "delay_seconds": None,
                "set_data": True,
                "data": json.dumps(spec.data),
                "set_group_key": True,
                "group_key": spec.group_key,
                "set_priority": True,
                "priority": spec.priority,
                "set_fairness_key": True,
                "fairness_key": spec.fairness_key,
            },
        )

    def get(self, queue: str, schedule_key: str, *, now: datetime | None = None) -> Schedule:
        params = {"queue": queue, "schedule_key": schedule_key}
        with driver_connection(self.engine, driver_sql("get_schedule"), params) as conn:
            rows = run(conn, driver_sql("get_schedule"), params)
            at = _db_now(conn, now)
        if not rows:
            raise NotFound(f"No schedule with key {schedule_key!r} in queue {queue!r}.")
        return Schedule.from_row(rows[0], at)

    def list(
        self, queue: str, *, after: str | None = None, limit: int = 1000, now: datetime | None = None
    ) -> list[Schedule]:
        """A queue's schedules in key order, `limit` at most, those after the key `after`."""
        params = {"queue": queue, "after": after, "limit": limit}
        with driver_connection(self.engine, driver_sql("list_schedules"), params) as conn:
            rows = run(conn, driver_sql("list_schedules"), params)
            at = _db_now(conn, now)
        return [Schedule.from_row(row, at) for row in rows]

    def delete(self, queue: str, schedule_key: str, *, actor: str, now: datetime | None = None) -> Schedule:
        """Stop a schedule: it is removed and its waiting occurrence cancelled; returns it as it was."""
        params = {"queue": queue, "schedule_key": schedule_key, "now": now}
        with driver_connection(self.engine, driver_sql("delete_schedule"), params) as conn:
            rows = run(conn, driver_sql("lock_schedule"), params)
            if not rows:
                raise NotFound(f"No schedule with key {schedule_key!r} in queue {queue!r}.")
            row = rows[0]
            if row["enqueued_through"] is not None and row["enqueued_through"] > row["db_now"]:
                self._cancel_waiting(conn, row, actor, "schedule deleted", now)
            run(conn, driver_sql("delete_schedule"), params)
            self._log(conn, row, Action.SCHEDULE_DELETED, actor, now, {}, None)
            return Schedule.from_row(row, row["db_now"], upcoming=0)

    def _log(
        self,
        conn: psycopg.Connection[Any],
        row: Row,
        action: str,
        actor: str,
        now: datetime | None,
        details: dict[str, Any],
        schedule_on: datetime | None,
    ) -> None:
        """A timeline entry of the schedule; `schedule_on`: the occurrence now waiting, if any."""
        described = {
            **details,
            "cron": row["cron"],
            "timezone": row["timezone"],
            "catch_up": row["catch_up"],
            "paused": row["paused"],
        }
        if row["group_key"] is not None:
            described["group_key"] = row["group_key"]
        run(
            conn,
            driver_sql("log_schedule_change"),
            {
                "queue": row["queue"],
                "schedule_key": row["schedule_key"],
                "action": action,
                "actor": actor,
                "schedule_on": schedule_on,
                "details": json.dumps(described),
                "now": now,
            },
        )


def _spec_params(spec: ScheduleSpec, *, stored: bool = False) -> dict[str, Any]:
    """The spec's fields; `stored`: as bound parameters (data as JSON text)."""
    return {
        "cron": spec.cron,
        "timezone": spec.timezone,
        "data": json.dumps(spec.data, separators=(",", ":")) if stored else spec.data,
        "group_key": spec.group_key,
        "catch_up": spec.catch_up,
        "paused": spec.paused,
        "priority": spec.priority,
        "fairness_key": spec.fairness_key,
    }


_DB_NOW = pyformat("SELECT coalesce(CAST(:now AS timestamptz), now())")


def _db_now(conn: psycopg.Connection[Any], now: datetime | None) -> datetime:
    [[at]] = run(conn, _DB_NOW, {"now": now}, tuples=True)
    return at  # type: ignore[no-any-return]


def _next_waiting(row: Row) -> datetime | None:
    """The occurrence waiting as an event, for the timeline's `schedule_on` (None: none waits)."""
    through: datetime | None = row["enqueued_through"]
    if row["paused"] or through is None or through <= row["db_now"]:
        return None
    return through
