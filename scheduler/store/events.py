"""Events by natural key: schedule, read, reschedule or change, cancel, search, and their timeline."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from scheduler.errors import InFlight, KeyConflict, NotFound, StaleVersion
from scheduler.models import Event, NewEvent, Queue, ScheduleResult, TimelineEntry
from scheduler.rules import format_timestamp
from scheduler.sql import q
from scheduler.store import search
from scheduler.store.archive import archived_history

# Actor recorded for what tickler does by itself (expiring leases).
SYSTEM_ACTOR = "tickler"

# A key whose open event finishes between our insert attempt and our read of it is free again:
# try the insert again, a few times at most.
_SCHEDULE_ATTEMPTS = 5


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class EventChanges:
    """A PATCH: each field left UNSET is kept; `group_key=None` removes the group."""

    schedule_on: datetime | None = None
    delay_seconds: float | None = None
    data: Any = UNSET
    group_key: Any = UNSET


SearchFilter = search.SearchFilter


def _events_json(events: Sequence[NewEvent]) -> str:
    return json.dumps(
        [
            {
                "ord": ord_,
                "item_key": e.item_key,
                "group_key": e.group_key,
                "schedule_on": format_timestamp(e.schedule_on),
                "delay_seconds": e.delay_seconds,
                "data": e.data,
                "max_attempts": e.max_attempts,
            }
            for ord_, e in enumerate(events)
        ],
        separators=(",", ":"),
    )


class EventStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        # Single statements run without BEGIN / COMMIT round trips.
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(
        self, queue: Queue, event: NewEvent, *, actor: str, on_conflict: str = "reject", now: datetime | None = None
    ) -> tuple[Event, str]:
        """Schedule one event; return it with its outcome ("created", "ignored" or "replaced").

        Raises KeyConflict (reject: an open event has the key) or InFlight (replace: the open
        event is held under a live lease); both carry the existing event.
        """
        for _ in range(_SCHEDULE_ATTEMPTS):
            if on_conflict == "replace":
                with self.engine.begin() as conn:
                    [result] = self._schedule(conn, queue, [event], actor=actor, on_conflict=on_conflict, now=now)
                    if result.outcome in ("created", "replaced"):
                        assert result.id is not None
                        return self._by_id(conn, result.id, now), result.outcome
                row = self._open_event(queue.name, event.item_key, now)
            else:
                # One autocommit statement inserts and returns the event; when the key is taken,
                # the next statement (a fresh snapshot) reads the event that holds it.
                with self.autocommit.connect() as conn:
                    inserted = conn.execute(q("schedule_event"), self._one_event_params(queue, event, actor, now))
                    created = inserted.mappings().first()
                    if created is not None:
                        return Event.from_row(created), "created"
                row = self._open_event(queue.name, event.item_key, now)
            if row is None:
                continue  # it finished meanwhile; the key is free, schedule again
            existing = Event.from_row(row)
            if on_conflict == "ignore":
                return existing, "ignored"
            if on_conflict == "replace":
                raise InFlight("The open event with this key is in flight; it cannot be replaced.", event=existing)
            raise KeyConflict("An open event already has this key.", event=existing)
        raise RuntimeError(f"could not schedule {event.item_key!r}: its key kept changing state")

    def _open_event(self, queue: str, item_key: str, now: datetime | None) -> sa.RowMapping | None:
        with self.autocommit.connect() as conn:
            found: sa.RowMapping | None = (
                conn.execute(q("get_open_event"), {"queue": queue, "item_key": item_key, "now": now}).mappings().first()
            )
        return found

    @staticmethod
    def _one_event_params(queue: Queue, event: NewEvent, actor: str, now: datetime | None) -> dict[str, Any]:
        return {
            "queue": queue.name,
            "item_key": event.item_key,
            "group_key": event.group_key,
            "schedule_on": event.schedule_on,
            "delay_seconds": event.delay_seconds,
            "data": json.dumps(event.data, separators=(",", ":")),
            "max_attempts": event.max_attempts,
            "default_max_attempts": queue.max_attempts,
            "actor": actor,
            "now": now,
        }

    def schedule_batch(
        self,
        queue: Queue,
        events: Sequence[NewEvent],
        *,
        actor: str,
        on_conflict: str = "reject",
        now: datetime | None = None,
    ) -> list[ScheduleResult]:
        """Schedule many events in one statement (keys must be distinct); one result per event, in order."""
        with self.engine.begin() as conn:
            return self._schedule(
                conn, queue, events, actor=actor, on_conflict=on_conflict, now=now, report_conflicts=True
            )

    def _schedule(
        self,
        conn: sa.Connection,
        queue: Queue,
        events: Sequence[NewEvent],
        *,
        actor: str,
        on_conflict: str,
        now: datetime | None,
        report_conflicts: bool = False,
    ) -> list[ScheduleResult]:
        params = {
            "queue": queue.name,
            "events": _events_json(events),
            "actor": actor,
            "default_max_attempts": queue.max_attempts,
            "now": now,
        }
        if on_conflict == "replace":
            # A lease that ran out makes its event replaceable; end such leases first.
            only_key = events[0].item_key if len(events) == 1 else None
            self._expire_leases(conn, queue=queue.name, item_key=only_key, now=now)
            rows = conn.execute(q("schedule_events_replacing"), params).mappings().all()
        else:
            rows = conn.execute(q("schedule_events"), params).mappings().all()

        conflicts = [row["item_key"] for row in rows if not row["written"]]
        existing_ids: dict[str, int] = {}
        # A batch reports the id each key conflicted with, also a batch of one; schedule()
        # reads the whole conflicting event itself.
        if conflicts and report_conflicts:
            rows_found = conn.execute(q("open_event_ids"), {"queue": queue.name, "item_keys": conflicts})
            existing_ids = {row.item_key: row.id for row in rows_found}
        not_written = {"reject": "rejected", "ignore": "ignored", "replace": "rejected"}[on_conflict]
        results = []
        for row in rows:
            if row["written"]:
                outcome = "replaced" if row["replaced"] else "created"
                results.append(ScheduleResult(row["item_key"], outcome, row["id"]))
            else:
                results.append(ScheduleResult(row["item_key"], not_written, existing_ids.get(row["item_key"])))
        return results

    # -- reading --------------------------------------------------------------------------------

    def get(self, queue: str, item_key: str, *, now: datetime | None = None) -> Event:
        """The open event of the key, else its most recent one."""
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            row = (
                conn.execute(q("get_latest_event"), {"queue": queue, "item_key": item_key, "now": now})
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"No event with key {item_key!r} in queue {queue!r}.")
        return Event.from_row(row)

    def get_many(self, ids: Sequence[int], *, now: datetime | None = None) -> list[Event]:
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            rows = conn.execute(q("get_events_by_id"), {"ids": list(ids), "now": now}).mappings().all()
        by_id = {row["id"]: Event.from_row(row) for row in rows}
        return [by_id[i] for i in ids if i in by_id]

    def timeline(self, queue: str, item_key: str) -> list[TimelineEntry]:
        """The key's timeline entries still in PostgreSQL, oldest first. Empty when all of them
        were archived (see archived()); NotFound when the key was never seen."""
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            rows = conn.execute(q("timeline"), {"queue": queue, "item_key": item_key}).mappings().all()
            if not rows and archived_history(conn, queue, item_key) is None:
                raise NotFound(f"Key {item_key!r} was never seen in queue {queue!r}.")
        return [TimelineEntry(**row) for row in rows]

    def archived(self, queue: str, item_key: str) -> dict[str, Any] | None:
        """Where the archive job moved the key's older history, or None."""
        return archived_history(self.engine, queue, item_key)

    def search(self, queue: str, where: search.SearchFilter, *, now: datetime | None = None) -> list[Event]:
        """A page of events in (schedule_on, id) order; see scheduler.store.search."""
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            rows = conn.execute(search.build_query(queue, where, now)).mappings().all()
        return [Event.from_row(row) for row in rows]

    # -- changing -------------------------------------------------------------------------------

    def change(
        self,
        queue: str,
        item_key: str,
        changes: EventChanges,
        *,
        actor: str,
        if_match: Collection[int] | None = None,
        now: datetime | None = None,
    ) -> Event:
        """Reschedule the open event of a key and/or change its data or group."""
        with self.engine.begin() as conn:
            current, db_now = self._lock_open(conn, queue, item_key, if_match=if_match, now=now)
            schedule_on = current.schedule_on
            if changes.delay_seconds is not None:
                schedule_on = db_now + timedelta(seconds=changes.delay_seconds)
            elif changes.schedule_on is not None:
                schedule_on = changes.schedule_on
            data = current.data if changes.data is UNSET else changes.data
            group_key = current.group_key if changes.group_key is UNSET else changes.group_key

            changed = [
                name
                for name, old, new in (
                    ("schedule_on", current.schedule_on, schedule_on),
                    ("data", current.data, data),
                    ("group_key", current.group_key, group_key),
                )
                if old != new
            ]
            if not changed:
                return current
            details: dict[str, Any] = {"changed": changed}
            if "schedule_on" in changed:
                action = "rescheduled"
                details["previous_schedule_on"] = format_timestamp(current.schedule_on)
            else:
                action = "updated"
            if "group_key" in changed:
                details["previous_group_key"] = current.group_key
            row = (
                conn.execute(
                    q("change_event"),
                    {
                        "id": current.id,
                        "schedule_on": schedule_on,
                        "data": json.dumps(data),
                        "group_key": group_key,
                        "action": action,
                        "actor": actor,
                        "details": json.dumps(details),
                        "now": now,
                    },
                )
                .mappings()
                .one()
            )
            return Event.from_row(row)

    def cancel(
        self,
        queue: str,
        item_key: str,
        *,
        actor: str,
        reason: str | None = None,
        if_match: Collection[int] | None = None,
        now: datetime | None = None,
    ) -> Event:
        """Cancel the open event of a key."""
        with self.engine.begin() as conn:
            current, _ = self._lock_open(conn, queue, item_key, if_match=if_match, now=now)
            row = (
                conn.execute(q("cancel_event"), {"id": current.id, "actor": actor, "reason": reason, "now": now})
                .mappings()
                .one()
            )
            return Event.from_row(row)

    def cancel_matching(
        self,
        queue: str,
        *,
        actor: str,
        group_key: str | None = None,
        item_key_prefix: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """Cancel every open event of the queue that matches and is not in flight; return how many."""
        if group_key is None and item_key_prefix is None:
            raise ValueError("cancel_matching needs a group_key or an item_key_prefix")
        with self.engine.begin() as conn:
            self._expire_leases(conn, queue=queue, item_key=None, now=now)
            return int(
                conn.execute(
                    q("cancel_matching"),
                    {
                        "queue": queue,
                        "actor": actor,
                        "group_key": group_key,
                        "prefix": item_key_prefix,
                        "prefix_end": search.prefix_end(item_key_prefix) if item_key_prefix else None,
                        "reason": reason,
                        "now": now,
                    },
                ).scalar_one()
            )

    def expire_leases(self, *, queue: str | None = None, now: datetime | None = None) -> int:
        """End every lease whose time is up; return how many events it released (or finished)."""
        with self.engine.begin() as conn:
            return self._expire_leases(conn, queue=queue, item_key=None, now=now)

    # -- helpers --------------------------------------------------------------------------------

    def _expire_leases(
        self, conn: sa.Connection, *, queue: str | None, item_key: str | None, now: datetime | None
    ) -> int:
        rows = conn.execute(
            q("expire_leases"), {"queue": queue, "item_key": item_key, "actor": SYSTEM_ACTOR, "now": now}
        ).all()
        return len(rows)

    def _lock_open(
        self, conn: sa.Connection, queue: str, item_key: str, *, if_match: Collection[int] | None, now: datetime | None
    ) -> tuple[Event, datetime]:
        params = {"queue": queue, "item_key": item_key, "now": now}
        row = conn.execute(q("lock_open_event"), params).mappings().first()
        if row is not None and row["status"] == "pending" and row["lease_id"] is not None:
            # Its lease ran out but was not ended yet: end it now, then look again.
            self._expire_leases(conn, queue=queue, item_key=item_key, now=now)
            row = conn.execute(q("lock_open_event"), params).mappings().first()
        if row is None:
            raise NotFound(f"No open event with key {item_key!r} in queue {queue!r}.")
        event = Event.from_row(row)
        if event.status == "in_flight":
            raise InFlight("The event is in flight (claimed under a live lease); try again after it.", event=event)
        if if_match is not None and event.version not in if_match:
            raise StaleVersion(f"The event is at version {event.version}; If-Match named another.", event=event)
        return event, row["db_now"]

    @staticmethod
    def _by_id(conn: sa.Connection, event_id: int, now: datetime | None) -> Event:
        row = conn.execute(q("get_events_by_id"), {"ids": [event_id], "now": now}).mappings().one()
        return Event.from_row(row)
