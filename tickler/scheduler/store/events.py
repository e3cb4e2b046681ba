"""Events by natural key: schedule, read, reschedule or change, cancel, search, and their timeline."""

from __future__ import annotations

import json
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
import structlog
from psycopg.types.json import Jsonb

from tickler.scheduler.db import unavailable_reason
from tickler.scheduler.errors import Archived, InFlight, KeyConflict, NotFound, StaleVersion
from tickler.scheduler.models import Event, NewEvent, Queue, ScheduleResult, TimelineEntry
from tickler.scheduler.replica import ReadEngines
from tickler.scheduler.states import OnConflict, Scheduled
from tickler.scheduler.store import search
from tickler.scheduler.store.archive import archived_history
from tickler.scheduler.store.group_commit import GroupCommit
from tickler.scheduler.store.operations import EventOperations
from tickler.scheduler.store.search import Matching
from tickler.scheduler.store.statistics import StatisticsStore, WriterLook
from tickler.scheduler.tracing import TraceContext

log = structlog.get_logger(__name__)

try:
    import orjson as _orjson
except ImportError:  # an optional speed-up (api/jsonio.py)
    _orjson = None  # type: ignore[assignment]

# tickler_schedule_events()'s outcomes for an item it wrote, and for one held under a lease.
_WRITTEN = frozenset({Scheduled.CREATED, Scheduled.REPLACED, Scheduled.DEBOUNCED})
_IN_FLIGHT = "in_flight"


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
    priority: Any = UNSET
    fairness_key: Any = UNSET  # None: no fairness key


SearchFilter = search.SearchFilter


def _dumps_bytes(value: Any) -> bytes:
    """Compact JSON for jsonb parameters: orjson when installed (several times faster on a batch
    of 10,000), else json; a value orjson will not take (an integer beyond 64 bits) goes to json."""
    if _orjson is not None:
        try:
            return bytes(_orjson.dumps(value))
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":")).encode()


def _items(events: Sequence[NewEvent], traces: Sequence[TraceContext | None] | None) -> dict[str, Any]:
    """The events as tickler_schedule_events() takes them: one typed array per field, aligned by
    position, but the data, one JSON array. Numbers go as the type of their column's array and
    times in UTC (a time without offset is local, as format_timestamp reads it)."""
    traced = traces is not None and any(t is not None for t in traces)
    return {
        "item_key": [e.item_key for e in events],
        "group_key": [e.group_key for e in events],
        "schedule_on": [None if e.schedule_on is None else e.schedule_on.astimezone(UTC) for e in events],
        "delay_seconds": [None if e.delay_seconds is None else float(e.delay_seconds) for e in events],
        "data": Jsonb([e.data for e in events], _dumps_bytes),  # one JSON array (see queries.sql)
        "max_attempts": [None if e.max_attempts is None else int(e.max_attempts) for e in events],
        "priority": [None if e.priority is None else int(e.priority) for e in events],
        "fairness_key": [e.fairness_key for e in events],
        "traceparent": [None if t is None else t.traceparent for t in traces] if traced else None,  # type: ignore[union-attr]
        "tracestate": [None if t is None else t.tracestate for t in traces] if traced else None,  # type: ignore[union-attr]
    }


class EventStore(EventOperations):
    def __init__(self, engine: sa.Engine, reads: ReadEngines | None = None) -> None:
        super().__init__(engine, reads)
        # Off (0) unless the API turns it on (TICKLER_GROUP_COMMIT_MS): an in-process caller is alone.
        self.groups: GroupCommit[tuple[NewEvent, TraceContext | None], dict[str, Any]] = GroupCommit(
            self._write_group, shared=lambda error: unavailable_reason(error) is not None
        )
        self.statistics_look = WriterLook(StatisticsStore(engine))

    # -- scheduling -----------------------------------------------------------------------------
    # Every write of new events is one call of one SQL function, tickler_schedule_events()
    # (scheduler/database/writing.sql): the insert, the replace or debounce, their timeline, the
    # trace contexts and the wake-up handshake, for one event or ten thousand, the fields sent as
    # typed arrays. A single event is a group of one (group commit, below); a batch the same call
    # without the events' rows in its answer.

    def schedule(
        self,
        queue: Queue,
        event: NewEvent,
        *,
        actor: str,
        on_conflict: str = OnConflict.REJECT,
        now: datetime | None = None,
        debounce_max_seconds: float | None = None,
        trace: TraceContext | None = None,
    ) -> tuple[Event, str]:
        """Schedule one event; return it with its outcome (created, ignored, replaced, debounced).

        Raises KeyConflict (reject: an open event has the key) or InFlight (replace, debounce:
        the open event is held under a live lease); both carry the existing event.
        """
        # One autocommit statement, one round trip, on the driver directly; shared with the
        # concurrent requests of this process when group commit is on (scheduler/store/group_commit.py).
        # A lease that ran out makes its event changeable: tickler_schedule_events() ends it.
        key = (queue.name, actor, on_conflict, now, debounce_max_seconds)
        row = self.groups.submit(key, event.item_key, (event, trace))
        found = Event.from_row(row)
        outcome = row["scheduled"]
        if outcome in _WRITTEN:
            return found, outcome
        if outcome == _IN_FLIGHT:
            raise InFlight("The open event with this key is in flight; it cannot be changed.", event=found)
        if on_conflict == OnConflict.IGNORE:
            return found, Scheduled.IGNORED
        raise KeyConflict("An open event already has this key.", event=found)

    def schedule_batch(
        self,
        queue: Queue,
        events: Sequence[NewEvent],
        *,
        actor: str,
        on_conflict: str = OnConflict.REJECT,
        now: datetime | None = None,
        debounce_max_seconds: float | None = None,
        traces: Sequence[TraceContext | None] | None = None,
    ) -> list[ScheduleResult]:
        """Schedule many events in one statement (keys must be distinct); one result per event, in order.

        A key that was not written reports the id of the open event that holds it. `traces`:
        each event's trace context (by position), kept with the events written.
        """
        params = self._params(queue.name, actor, on_conflict, now, debounce_max_seconds)
        params.update(_items(events, traces), with_events=False)
        # One statement (its own transaction), on the driver: no per-row SQLAlchemy processing.
        rows = self.rows("schedule_batch", params, tuples=True)
        self._look_at_statistics()
        refused = Scheduled.IGNORED if on_conflict == OnConflict.IGNORE else Scheduled.REJECTED
        written = _WRITTEN
        return [
            ScheduleResult(item_key, outcome if outcome in written else refused, id_) for item_key, outcome, id_ in rows
        ]

    def _write_group(
        self, key: Hashable, items: Sequence[tuple[NewEvent, TraceContext | None]]
    ) -> list[dict[str, Any]]:
        """Schedule the single events of one group key (one, or those of concurrent requests) in
        one statement: per item, in order, its outcome (`scheduled`) and the event written or the
        one that holds the key."""
        assert isinstance(key, tuple)
        params = self._params(*key)
        params.update(_items([event for event, _ in items], [trace for _, trace in items]), with_events=True)
        rows = self.rows("schedule_events", params)
        self._look_at_statistics()
        return rows

    def _look_at_statistics(self) -> None:
        """After a write (committed): the planner statistics of what was written (WriterLook),
        which only a dispatcher would keep otherwise. Its failure is no failure of the write."""
        try:
            self.statistics_look.after_write()
        except sa.exc.DBAPIError as error:
            log.debug("statistics_look_failed", error=type(error.orig).__name__)

    @staticmethod
    def _params(
        queue: str, actor: str, on_conflict: str, now: datetime | None, debounce_max_seconds: float | None
    ) -> dict[str, Any]:
        return {
            "queue": queue,
            "actor": actor,
            "on_conflict": on_conflict,
            "now": now,
            "debounce_max_seconds": debounce_max_seconds,
        }

    # -- reading --------------------------------------------------------------------------------

    def get(self, queue: str, item_key: str, *, now: datetime | None = None) -> Event:
        """The open event of the key, else its most recent one."""
        rows = self.rows("get_latest_event", {"queue": queue, "item_key": item_key, "now": now})
        if not rows:
            # "never seen" and "moved to the archive" are different answers for the caller
            archived = archived_history(self.engine, queue, item_key)
            if archived is not None:
                raise Archived(
                    f"Every event with key {item_key!r} in queue {queue!r} was archived "
                    f"(through {archived['archived_through']}, under {archived['location']}).",
                    archived=archived,
                )
            raise NotFound(f"No event with key {item_key!r} in queue {queue!r}.")
        return Event.from_row(rows[0])

    def get_many(self, queue: str, item_key: str, ids: Sequence[int], *, now: datetime | None = None) -> list[Event]:
        """Events of one key by id (those its timeline names), in the order of `ids`; ids that are
        not the key's, or no longer kept, are left out."""
        params = {"queue": queue, "item_key": item_key, "ids": list(ids), "now": now}
        rows = self.rows("get_events_by_id", params)
        by_id = {row["id"]: Event.from_row(row) for row in rows}
        return [by_id[i] for i in ids if i in by_id]

    def timeline(self, queue: str, item_key: str) -> list[TimelineEntry]:
        """The key's timeline entries still in PostgreSQL, oldest first. Empty when all of them
        were archived (see archived()); NotFound when the key was never seen."""
        params = {"queue": queue, "item_key": item_key}
        # a key a replica has not seen yet is read on the primary: "never seen" is never a lag
        rows = self.lagging_rows("timeline", params) or self.rows("timeline", params)
        if not rows and archived_history(self.engine, queue, item_key) is None:
            raise NotFound(f"Key {item_key!r} was never seen in queue {queue!r}.")
        return [TimelineEntry(**row) for row in rows]

    def archived(self, queue: str, item_key: str) -> dict[str, Any] | None:
        """Where the archive job moved the key's older history, or None."""
        return archived_history(self.engine, queue, item_key)

    def search(self, queue: str, where: search.SearchFilter, *, now: datetime | None = None) -> list[Event]:
        """A page of events in (schedule_on or changed_on, id) order; see scheduler.store.search."""
        rows = self.reads.read(lambda engine: search.rows(engine, queue, where, now))
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
        """Reschedule the open event of a key and/or change its data or group: tickler_change_event()
        decides and writes (scheduler/database/writing.sql), as tickler_schedule() does a replace."""
        given = {
            name: getattr(changes, name) is not UNSET for name in ("data", "group_key", "priority", "fairness_key")
        }
        row = self._one_event_by_key(
            "change_event",
            {
                "queue": queue,
                "item_key": item_key,
                "actor": actor,
                "reason": None,
                "now": now,
                "if_match": None if if_match is None else list(if_match),
                "schedule_on": changes.schedule_on,
                "delay_seconds": changes.delay_seconds,
                "set_data": given["data"],
                "data": Jsonb(changes.data, _dumps_bytes) if given["data"] else None,
                "set_group_key": given["group_key"],
                "group_key": changes.group_key if given["group_key"] else None,
                "set_priority": given["priority"],
                "priority": changes.priority if given["priority"] else None,
                "set_fairness_key": given["fairness_key"],
                "fairness_key": changes.fairness_key if given["fairness_key"] else None,
            },
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
        """Cancel the open event of a key (tickler_cancel_event, scheduler/database/writing.sql)."""
        params: dict[str, Any] = {"queue": queue, "item_key": item_key, "actor": actor, "reason": reason}
        params.update(now=now, if_match=None if if_match is None else list(if_match))
        return Event.from_row(self._one_event_by_key("cancel_event", params))

    def cancel_matching(
        self, queue: str, matching: Matching, *, actor: str, reason: str | None = None, now: datetime | None = None
    ) -> int:
        """Cancel every open event of the queue that matches and is not in flight; return how many."""
        params = {"queue": queue, "actor": actor, "reason": reason, "now": now, **matching.params()}
        ((cancelled,),) = self.rows("cancel_matching", params, tuples=True)  # one statement, its own transaction
        return int(cancelled)

    # -- helpers --------------------------------------------------------------------------------

    def _one_event_by_key(self, query: str, params: dict[str, Any]) -> dict[str, Any]:
        """The event that `query` changed by key, or the refusal it answered as an error. One
        statement, its own transaction: a lease that ran out, ended on the way, stays ended."""
        (row,) = self.rows(query, params)
        refused = row.pop("refused")
        if refused is None:
            return dict(row)
        if refused == "not_found":
            raise NotFound(f"No open event with key {params['item_key']!r} in queue {params['queue']!r}.")
        event = Event.from_row(row)
        if refused == "in_flight":
            raise InFlight("The event is in flight (claimed under a live lease); try again after it.", event=event)
        raise StaleVersion(f"The event is at version {event.version}; If-Match named another.", event=event)
