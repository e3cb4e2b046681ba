"""Operations on events and queues (SPEC §7): retry dead events, pause, resume and delete queues,
and the per-queue gauges. Mixed into EventStore and QueueStore, so callers write
`store.events.retry(...)` and `store.queues.pause(...)`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import sqlalchemy.exc

from tickler.scheduler.db import driver_connection
from tickler.scheduler.errors import KeyConflict, NotFound, QueueInUse
from tickler.scheduler.models import Event, Queue
from tickler.scheduler.plain import gauge_values
from tickler.scheduler.sql import driver_sql, rowcount, run
from tickler.scheduler.store import audit
from tickler.scheduler.store.base import EngineStore
from tickler.scheduler.store.search import Matching

# The one-open-event-per-key index: a retry that races a new event of its key runs into it.
OPEN_KEY_INDEX = "tickler_event_open_key"

# A bulk retry that runs into a key scheduled meanwhile starts over (that key is then open
# and no longer a candidate); this many times at most.
_RETRY_MATCHING_ATTEMPTS = 5


def _is_open_key_conflict(error: sqlalchemy.exc.IntegrityError) -> bool:
    diag = getattr(error.orig, "diag", None)
    return getattr(diag, "constraint_name", None) == OPEN_KEY_INDEX


class EventOperations(EngineStore):
    """Retrying dead events (mixed into EventStore)."""

    def retry(
        self,
        queue: str,
        item_key: str,
        *,
        actor: str,
        schedule_on: datetime | None = None,
        delay_seconds: float | None = None,
        now: datetime | None = None,
    ) -> Event:
        """Open the key's most recent event again if it is dead, with a fresh budget of attempts.

        Due at `schedule_on`, after `delay_seconds`, or now. The same event (same id) is reopened:
        `version` goes up, `redeliver_count` stays, and `max_attempts` becomes `redeliver_count`
        plus the event's budget, so it has as many attempts as it first had, counted from now.
        Raises NotFound (the most recent event is not dead, or the key was never seen) or
        KeyConflict (the key has an open event; it carries that event).
        """
        params = {
            "queue": queue,
            "item_key": item_key,
            "actor": actor,
            "schedule_on": schedule_on,
            "delay_seconds": delay_seconds,
            "now": now,
        }
        try:
            rows = self.rows("retry_event", params)
        except sqlalchemy.exc.IntegrityError as error:
            if not _is_open_key_conflict(error):
                raise
            rows = []  # an event of this key was scheduled meanwhile: it is the open one
        if rows:
            return Event.from_row(rows[0])
        self._raise_not_retried(queue, item_key, now)

    def _raise_not_retried(self, queue: str, item_key: str, now: datetime | None) -> NoReturn:
        open_rows = self.rows("get_open_event", {"queue": queue, "item_key": item_key, "now": now})
        if open_rows:
            raise KeyConflict(
                "The key already has an open event; only a dead event can be retried.",
                event=Event.from_row(open_rows[0]),
            )
        raise NotFound(f"The most recent event of key {item_key!r} in queue {queue!r} is not dead.")

    def retry_matching(self, queue: str, matching: Matching, *, actor: str, now: datetime | None = None) -> int:
        """retry() every dead event of the queue that matches and is its key's most recent event;
        each is due now. Returns how many were opened again."""
        params = {"queue": queue, "actor": actor, "now": now, **matching.params()}
        for _ in range(_RETRY_MATCHING_ATTEMPTS):
            try:
                [[retried]] = self.rows("retry_matching", params, tuples=True)
                return int(retried)
            except sqlalchemy.exc.IntegrityError as error:
                if not _is_open_key_conflict(error):
                    raise
        raise RuntimeError(f"could not retry dead events of {queue!r}: their keys kept being scheduled")


@dataclass(frozen=True)
class QueueGauges:
    """A queue's gauges at `at` (database clock): what /metrics and the dashboard show."""

    name: str
    paused: bool
    pending: int
    due: int
    in_flight: int
    dead: int
    # seconds since the oldest due event (not in flight) came due; 0 when none is due
    oldest_due_age_seconds: float
    at: datetime


@dataclass(frozen=True)
class DeletedQueue:
    name: str
    cancelled: int  # open events cancelled (reason "queue deleted") before the delete
    deleted_events: int


class QueueOperations(EngineStore):
    """Pausing, resuming and deleting queues; their gauges (mixed into QueueStore)."""

    def pause(self, name: str, *, actor: str = audit.SYSTEM_ACTOR) -> Queue:
        """Pause the queue: no claims (dispatchers, pull consumers); scheduling goes on. Idempotent."""
        return self._set_paused(name, True, actor)

    def resume(self, name: str, *, actor: str = audit.SYSTEM_ACTOR) -> Queue:
        """Resume a paused queue (idempotent)."""
        return self._set_paused(name, False, actor)

    def _set_paused(self, name: str, paused: bool, actor: str) -> Queue:
        """A call that changes the state is an entry of the operations log, with the state it found
        and left; pausing a paused queue (or resuming a running one) changes nothing and logs nothing."""
        params = {"name": name, "paused": paused}
        with driver_connection(self.engine, driver_sql("set_queue_paused"), params) as conn:
            found = run(conn, driver_sql("get_queue_for_update"), {"name": name})
            if not found:
                raise NotFound(f"No queue named {name!r}.")
            [row] = run(conn, driver_sql("set_queue_paused"), params)
            if found[0]["paused"] == paused:
                return Queue.from_row(row)
            audit.OperationsLog.record(
                conn,
                actor=actor,
                action=audit.QUEUE_PAUSED if paused else audit.QUEUE_RESUMED,
                queue=name,
                before={"paused": found[0]["paused"]},
                after={"paused": paused},
            )
        return Queue.from_row(row)

    def delete(self, name: str, *, actor: str, cancel_open: bool = False, now: datetime | None = None) -> DeletedQueue:
        """Delete the queue and its events; its keys' timelines stay. The name is free again.

        Raises QueueInUse while it holds open events (unless `cancel_open`: they are cancelled
        first, reason "queue deleted", with their timeline entries) or while an unfinished archive
        run holds some of its events; NotFound when there is no such queue.
        """
        named = {"name": name}
        with driver_connection(self.engine, driver_sql("delete_queue"), named) as conn:
            # Locked first: no event of this queue can be scheduled until we are done.
            if not run(conn, driver_sql("lock_queue_for_delete"), named):
                raise NotFound(f"No queue named {name!r}.")
            queue_rows = run(conn, driver_sql("get_queue"), named)
            [[archiving]] = run(conn, driver_sql("queue_in_archive_run"), named, tuples=True)
            if archiving:
                raise QueueInUse(f"An unfinished archive run holds events of queue {name!r}; run the archive first.")
            cancelled = 0
            if cancel_open:
                params = {"name": name, "actor": actor, "now": now}
                [[count]] = run(conn, driver_sql("cancel_queue_events"), params, tuples=True)
                cancelled = int(count)
            else:
                [[open_events]] = run(conn, driver_sql("queue_open_events"), {**named, "limit": 1}, tuples=True)
                if open_events:
                    raise QueueInUse(
                        f"Queue {name!r} still holds open events; cancel them first, or delete with cancel_open=true."
                    )
            settings = audit.queue_settings(Queue.from_row(queue_rows[0]))
            run(conn, driver_sql("keep_queue_entries"), named)
            deleted = rowcount(conn, driver_sql("delete_queue_events"), named)
            run(conn, driver_sql("delete_queue_counts"), named)
            run(conn, driver_sql("delete_queue_minute_stats"), named)
            # Its schedules go with it (ON DELETE CASCADE); their keys' timelines say so.
            run(conn, driver_sql("log_queue_schedules_deleted"), {**named, "actor": actor, "now": now})
            run(conn, driver_sql("delete_queue_due_counts"), named)
            [_] = run(conn, driver_sql("delete_queue"), named)
            outcome = {"cancelled": cancelled, "deleted_events": deleted}
            audit.OperationsLog.record(
                conn, actor=actor, action=audit.QUEUE_DELETED, queue=name, before=settings, after=outcome
            )
        return DeletedQueue(name=name, cancelled=cancelled, deleted_events=deleted)

    def gauges(self, names: list[str] | None = None, *, now: datetime | None = None) -> list[QueueGauges]:
        """Every queue's gauges (or those named), from counters and indexes: no row is counted by scan."""
        return [_gauges(row) for row in self.lagging_rows("queue_gauges", {"names": names, "now": now})]


def _gauges(row: Any) -> QueueGauges:
    return QueueGauges(name=row["name"], paused=row["paused"], **gauge_values(row), at=row["db_now"])
