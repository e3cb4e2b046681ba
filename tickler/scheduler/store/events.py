"""Events by natural key: schedule, read, reschedule or change, cancel, search, and their timeline."""

from __future__ import annotations

import json
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from tickler.scheduler.db import driver_connection, driver_rows, unavailable_reason
from tickler.scheduler.errors import Archived, InFlight, KeyConflict, NotFound, StaleVersion
from tickler.scheduler.models import Event, NewEvent, Queue, ScheduleResult, TimelineEntry
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.sql import driver_sql, q
from tickler.scheduler.states import OnConflict, Scheduled
from tickler.scheduler.store import search
from tickler.scheduler.store.archive import archived_history
from tickler.scheduler.store.group_commit import GroupCommit
from tickler.scheduler.store.operations import EventOperations
from tickler.scheduler.store.search import Matching
from tickler.scheduler.tracing import TraceContext

try:
    import orjson as _orjson
except ImportError:  # an optional speed-up (api/jsonio.py)
    _orjson = None  # type: ignore[assignment]

# The staging table's columns (migration 0066, stage_copy), for binary COPY; max_attempts and
# priority go as text, cast in SQL as the jsonb path casts them (the same errors out of range).
_STAGE_TYPES = ["int8", "text", "text", "timestamptz", "float8", "jsonb", "text", "text", "text"]


# tickler_schedule()'s outcomes for an item it wrote, and for one held under a lease.
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


def _events_json(events: Sequence[NewEvent]) -> str:
    return _dumps(
        [
            {
                "ord": ord_,
                "item_key": e.item_key,
                "group_key": e.group_key,
                "schedule_on": format_timestamp(e.schedule_on),
                "delay_seconds": e.delay_seconds,
                "data": e.data,
                "max_attempts": e.max_attempts,
                "priority": e.priority,
                "fairness_key": e.fairness_key,
            }
            for ord_, e in enumerate(events)
        ]
    )


def _dumps(value: Any) -> str:
    """Compact JSON for jsonb parameters: orjson when installed (several times faster on a batch
    of 10,000), else json; a value orjson will not take (an integer beyond 64 bits) goes to json."""
    if _orjson is not None:
        try:
            return str(_orjson.dumps(value).decode())
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"))


def _dumps_bytes(value: Any) -> bytes:
    """_dumps, as bytes (orjson's own output when it takes the value)."""
    if _orjson is not None:
        try:
            return bytes(_orjson.dumps(value))
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":")).encode()


# The modes under which a free key is simply written (schedule_new); replace and debounce change
# an open event first, and go through tickler_schedule().
_NEW_ONLY = frozenset({OnConflict.REJECT, OnConflict.IGNORE})


def _new_params(params: dict[str, Any], event: NewEvent) -> dict[str, Any]:
    """schedule_new's parameters: the call's (queue, actor, now) and the event's fields, as
    _events_json writes them for tickler_schedule() (the same text, the same casts in SQL)."""
    data = event.data
    return {
        "queue": params["queue"],
        "actor": params["actor"],
        "now": params["now"],
        "item_key": event.item_key,
        "group_key": event.group_key,
        "schedule_on": format_timestamp(event.schedule_on),
        "delay_seconds": event.delay_seconds,
        "data": None if data is None else Jsonb(data, _dumps_bytes),
        "max_attempts": None if event.max_attempts is None else str(event.max_attempts),
        "priority": None if event.priority is None else str(event.priority),
        "fairness_key": event.fairness_key,
    }


def _traces_json(traces: Sequence[TraceContext | None]) -> str:
    """Trace contexts by position, for tickler_schedule_traced() (null: the item has none)."""
    return json.dumps(
        [None if t is None else {"traceparent": t.traceparent, "tracestate": t.tracestate} for t in traces],
        separators=(",", ":"),
    )


class EventStore(EventOperations):
    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        # Off (0) unless the API turns it on (TICKLER_GROUP_COMMIT_MS): an in-process caller is alone.
        self.groups: GroupCommit[tuple[NewEvent, TraceContext | None], dict[str, Any]] = GroupCommit(
            self._write_group, shared=lambda error: unavailable_reason(error) is not None
        )

    # -- scheduling -----------------------------------------------------------------------------
    # Every write of new events goes through one SQL function, tickler_schedule() (migration
    # 0008): the insert, the replace or debounce, their timeline and the wake-up handshake. One
    # exception, the commonest call: a single new event under reject or ignore is its single-event
    # insert step as one plain statement (schedule_new), and goes to the function only when that
    # answers nothing (tests/test_schedule_new.py holds the two to the same rows and answers).

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
        # A lease that ran out makes its event changeable: tickler_schedule() ends it (migration 0014).
        key = (queue.name, actor, on_conflict, now, debounce_max_seconds)
        row = self.groups.submit(key, event.item_key, (event, trace))
        found = Event.from_row(row)
        outcome = row["scheduled"]
        if outcome in _WRITTEN:
            if trace is not None:
                found = replace(found, traceparent=trace.traceparent, tracestate=trace.tracestate)
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
        copy_min_events: int = 0,
    ) -> list[ScheduleResult]:
        """Schedule many events in one statement (keys must be distinct); one result per event, in order.

        A key that was not written reports the id of the open event that holds it. `traces`:
        each event's trace context (by position), kept with the events written. A batch of at
        least `copy_min_events` events (0: never) without trace contexts goes by COPY into a
        staging table instead of as one jsonb parameter: the same outcomes, rows and errors.
        """
        traced = traces is not None and any(t is not None for t in traces)
        if copy_min_events and len(events) >= copy_min_events and not traced:
            rows = self._schedule_staged(queue, events, actor, on_conflict, now, debounce_max_seconds)
        else:
            params = self._params(queue, events, actor, on_conflict, now, debounce_max_seconds)
            query = "schedule_many"
            if traced:
                assert traces is not None
                query, params["traces"] = "schedule_many_traced", _traces_json(traces)
            # One statement (its own transaction), on the driver: no per-row SQLAlchemy processing.
            rows = driver_rows(self.engine, driver_sql(query), params, tuples=True)
        refused = Scheduled.IGNORED if on_conflict == OnConflict.IGNORE else Scheduled.REJECTED
        written = _WRITTEN
        return [
            ScheduleResult(item_key, outcome if outcome in written else refused, id_)
            for _, item_key, outcome, id_ in rows
        ]

    def schedule_batch_answer(
        self,
        queue: Queue,
        events: Sequence[NewEvent],
        *,
        actor: str,
        on_conflict: str = OnConflict.REJECT,
        now: datetime | None = None,
        debounce_max_seconds: float | None = None,
    ) -> tuple[str, dict[str, int]]:
        """schedule_batch by COPY, answered as the HTTP response body its results make
        (`{"results":[...]}`, compact JSON, written by PostgreSQL: no Python object per result)
        and the number of events per outcome."""
        refused = Scheduled.IGNORED if on_conflict == OnConflict.IGNORE else Scheduled.REJECTED
        ((body, outcomes, counts),) = self._schedule_staged(
            queue, events, actor, on_conflict, now, debounce_max_seconds, "schedule_staged_answer", str(refused)
        )
        return body, dict(zip(outcomes, counts, strict=True))

    def _schedule_staged(
        self,
        queue: Queue,
        events: Sequence[NewEvent],
        actor: str,
        on_conflict: str,
        now: datetime | None,
        debounce_max_seconds: float | None,
        query: str = "schedule_staged",
        refused: str | None = None,
    ) -> list[tuple[Any, ...]]:
        """The rows of `query`, the events sent by binary COPY into the session's staging table
        and written by tickler_schedule_staged() (migration 0066) in the same transaction."""
        params: dict[str, Any] = {
            "queue": queue.name,
            "actor": actor,
            "on_conflict": on_conflict,
            "now": now,
            "debounce_max_seconds": debounce_max_seconds,
        }
        if refused is not None:
            params["refused"] = refused
        statement = driver_sql(query)
        with driver_connection(self.engine, statement, params) as conn, conn.cursor(row_factory=tuple_row) as cursor:
            # In this transaction, every time: a pooler in transaction mode may hand the next
            # transaction another server session (one look at the catalog when there).
            cursor.execute(driver_sql("stage_open"), prepare=True)
            with cursor.copy(driver_sql("stage_copy")) as copy:
                copy.set_types(_STAGE_TYPES)
                write = copy.write_row
                for ord_, e in enumerate(events):
                    data = e.data
                    write(
                        (
                            ord_,
                            e.item_key,
                            e.group_key,
                            e.schedule_on,
                            e.delay_seconds,
                            None if data is None else Jsonb(data, _dumps_bytes),
                            None if e.max_attempts is None else str(e.max_attempts),
                            None if e.priority is None else str(e.priority),
                            e.fairness_key,
                        )
                    )
            cursor.execute(statement, params, prepare=True)
            return cursor.fetchall()

    def _write_group(
        self, key: Hashable, items: Sequence[tuple[NewEvent, TraceContext | None]]
    ) -> list[dict[str, Any]]:
        """Schedule the single events of one group key in one statement: per item, the row
        schedule_one answers (outcome, and the event written or the one that holds the key)."""
        assert isinstance(key, tuple)
        params: dict[str, Any] = dict(
            zip(("queue", "actor", "on_conflict", "now", "debounce_max_seconds"), key, strict=True)
        )
        if len(items) == 1 and items[0][1] is None and params["on_conflict"] in _NEW_ONLY:
            # The commonest call: one new event (or its key's open event). No row: no such queue,
            # or a key taken under our feet; tickler_schedule() below raises or names the event.
            rows = driver_rows(self.engine, driver_sql("schedule_new"), _new_params(params, items[0][0]))
            if rows:
                rows[0]["ord"] = 0
                return rows
        elif all(trace is None for _, trace in items) and params["on_conflict"] in _NEW_ONLY:
            # A group of new events: schedule_new's steps for all of them in one statement. The
            # items it answers nothing for go on to tickler_schedule(), which raises or names.
            params["events"] = _events_json([event for event, _ in items])
            rows = driver_rows(self.engine, driver_sql("schedule_new_many"), params)
            answered = {row["ord"] for row in rows}
            if len(answered) == len(items):
                rows.sort(key=lambda row: row["ord"])
                return rows
            rest = [n for n in range(len(items)) if n not in answered]
            params["events"] = _events_json([items[n][0] for n in rest])
            for row in driver_rows(self.engine, driver_sql("schedule_group"), params):
                row["ord"] = rest[row["ord"]]
                rows.append(row)
            rows.sort(key=lambda row: row["ord"])
            return rows
        params["events"] = _events_json([event for event, _ in items])
        name = "schedule_group"
        if any(trace is not None for _, trace in items):
            name, params["traces"] = "schedule_group_traced", _traces_json([trace for _, trace in items])
        rows = driver_rows(self.engine, driver_sql(name), params)
        rows.sort(key=lambda row: row["ord"])
        return rows

    @staticmethod
    def _params(
        queue: Queue,
        events: Sequence[NewEvent],
        actor: str,
        on_conflict: str,
        now: datetime | None,
        debounce_max_seconds: float | None,
    ) -> dict[str, Any]:
        return {
            "queue": queue.name,
            "events": _events_json(events),
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
        rows = self.rows("timeline", {"queue": queue, "item_key": item_key})
        if not rows and archived_history(self.engine, queue, item_key) is None:
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
        with self.engine.begin() as conn:
            return int(conn.execute(q("cancel_matching"), params).scalar_one())

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
