"""Leases: claim due events (one by one, or a whole group at once), then ack, nack, extend or
release them. A lease is identified by its id, and only a live lease can be finished: a lease
that expired and was claimed again can never be finished by its old holder. The delivery
metrics (scheduler.metrics) are counted here, once, whoever calls: dispatcher, pull API, reaper."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from tickler.scheduler import metrics
from tickler.scheduler.db import driver_connection, driver_rows
from tickler.scheduler.errors import StaleLease
from tickler.scheduler.models import Event, Lease, Queue
from tickler.scheduler.sql import driver_sql, run
from tickler.scheduler.store.base import EngineStore

# How soon to look again when an event is already due but was not claimed.
DUE_NOW_RETRY = timedelta(milliseconds=5)

# A dispatcher whose next event is due this soon sleeps without publishing its wake-up.
SHORT_SLEEP = timedelta(milliseconds=5)

# How many due grouped rows a group claim looks at per group it wants (groups hold several).
GROUP_SCAN_FACTOR = 50


@dataclass(frozen=True)
class FailResult:
    queue: str
    dead: int
    retried: int
    retry_at: datetime | None


@dataclass(frozen=True)
class Claim:
    """What a claim took, and — when the queue's flow control held it back — when to try again."""

    leases: list[Lease]
    # Seconds until a claim may find room again (None: not held back, or only a notification or
    # a resume can change it — paused).
    room_in: float | None = None
    # The queue is paused: nothing is claimed until it is resumed.
    paused: bool = False
    # The queue's settings as the claim read them (limited queues only): fresher than the caller's.
    queue: Queue | None = None


# A claim held back by max_in_flight looks again this often: leases end in other processes
# without telling this one (a NOTIFY per ack would serialise every capped queue's commits).
FLOW_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class SleepPlan:
    """When a dispatcher should look again: at `wake_at` (database time), or on a notification."""

    db_now: datetime
    next_due: datetime | None
    wake_at: datetime

    @property
    def seconds(self) -> float:
        return max(0.0, (self.wake_at - self.db_now).total_seconds())


def _leases(rows: Sequence[Mapping[str, Any]]) -> list[Lease]:
    grouped: dict[str, list[Event]] = {}
    for row in rows:
        grouped.setdefault(str(row["lease_id"]), []).append(Event.from_row(row))
    leases = []
    for lease_id, events in grouped.items():
        first = events[0]
        assert first.lease_expires_on is not None and first.claimed_by is not None
        leases.append(
            Lease(lease_id, first.queue, first.group_key, first.lease_expires_on, first.claimed_by, tuple(events))
        )
    return leases


class _Statements:
    """Where a claim's named statements run: each alone, in its own autocommit transaction on a
    pooled connection (db.driver_rows), or all on the one connection of a transaction opened by
    transaction() (db.driver_connection)."""

    def __init__(self, engine: sa.Engine, conn: psycopg.Connection[Any] | None = None) -> None:
        self.engine = engine
        self.conn = conn

    def rows(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        if self.conn is None:
            return driver_rows(self.engine, driver_sql(name), params)
        return run(self.conn, driver_sql(name), params)

    def one(self, name: str, params: Mapping[str, Any]) -> Any:
        """The first column of the statement's one row."""
        [row] = self.rows(name, params)
        return next(iter(row.values()))

    @contextmanager
    def transaction(self, name: str, params: Mapping[str, Any]) -> Iterator[_Statements]:
        """Statements that run in one transaction: this one's, or a new one (committed when the
        block ends; its errors name the statement `name` with `params`)."""
        if self.conn is not None:
            yield self
            return
        with driver_connection(self.engine, driver_sql(name), params) as conn:
            yield _Statements(self.engine, conn)


@dataclass(frozen=True)
class _Room:
    """How much a claim may take. A queue without limits: everything it asks for, at the caller's
    time, with the caller's settings. A paused or limited queue: what flow_room counted under the
    queue's flow lock, at the database's time read after the lock, with the settings read there."""

    settings: Queue
    limited: bool
    at: datetime | None  # the time to claim at (None: the database's clock, statement by statement)
    leases: int | None = None  # max_in_flight less the live leases (None: no max_in_flight)
    events: int | None = None  # the rate window's room (None: no rate)
    row: Mapping[str, Any] | None = None  # flow_room's row

    @classmethod
    def unlimited(cls, queue: Queue, now: datetime | None) -> _Room:
        return cls(queue, limited=False, at=now)

    @classmethod
    def hold(cls, db: _Statements, queue: str, now: datetime | None) -> _Room:
        """Take the queue's flow lock (until the transaction ends), then count its room in a new
        statement: a new snapshot, which sees every lease the previous holder committed."""
        db.rows("flow_lock", {"queue": queue})
        [row] = db.rows("flow_room", {"queue": queue, "now": now})
        # claimed_on follows the order of the flow lock
        return cls(Queue.from_row(row), True, row["db_now"], row["lease_room"], row["event_room"], row)

    def left(self, limit: int, leases: Sequence[Lease]) -> int:
        """How many more leases the claim may take, having taken `leases`."""
        left = limit - len(leases) if self.leases is None else min(limit, self.leases) - len(leases)
        if self.events is not None:
            left = min(left, self.events - sum(len(lease.events) for lease in leases))
        return left

    def record(self, db: _Statements, leases: list[Lease], limit: int) -> Claim:
        """A limited claim's end: its events enter the rate window (flow_record), and the claim says
        when the queue may have room again."""
        assert self.row is not None and self.at is not None
        name = self.settings.name
        taken = sum(len(lease.events) for lease in leases)
        if self.events is not None and taken:
            db.rows("flow_record", {"queue": name, "at": self.at, "events": taken})
        room_in: float | None = None
        if self.events is not None and taken >= self.events:
            # The window is full: it has room again when its oldest claim (maybe this one) leaves.
            room_at = self.row["rate_room_at"] or self.at + timedelta(seconds=self.row["window_seconds"])
            room_in = max(0.0, (room_at - self.at).total_seconds())
        if self.leases is not None and len(leases) >= self.leases:
            room_in = FLOW_POLL_SECONDS if room_in is None else max(room_in, FLOW_POLL_SECONDS)
        # Due events left behind by a capped claim belong to keys at their cap: their leases end in
        # other processes, which do not tell this one (as for max_in_flight). Nothing left: sleep.
        held_by_cap = self.settings.max_in_flight_per_key is not None and len(leases) < limit and room_in is None
        if held_by_cap and db.one("has_due_events", {"queue": name, "now": self.at}):
            room_in = FLOW_POLL_SECONDS
        return Claim(leases, room_in=room_in, queue=self.settings)


def _claim_events(
    db: _Statements, params: dict[str, Any], settings: Queue, *, fixed_at: datetime | None
) -> tuple[list[Lease], bool]:
    """Claim up to params["limit"] ungrouped events, a lease each, in one statement; with the
    leases, whether the queue has group work (tickler_groups_due, asked by the same statement).
    A fair queue's events go round robin: without a cap, unlocked (claim_events, :fair); under
    the flow lock, with its per-key room (claim_events_fair, after the queue's expired leases were
    ended, as the reaper ends them: their events are pending again)."""
    queue = settings.name
    if settings.fair_shared and params["flow"]:
        ended = db.rows("expire_leases", {"queue": queue, "actor": "tickler", "now": params["now"]})
        expired = len(ended)
        rows = db.rows("claim_events_fair", {**params, "claimed_at": fixed_at})
    else:
        rows = db.rows("claim_events", {**params, "fair": settings.fair_shared})
        # the expired leases it ended: of events it claimed, and of events that died of them
        expired = sum(1 for row in rows if row["lease_ended"]) + (rows[0]["died"] if rows else 0)
    _count_expired(queue, expired)
    return _leases([row for row in rows if row["id"] is not None]), bool(rows and rows[0]["groups_due"])


def _claim_groups(db: _Statements, params: dict[str, Any]) -> list[Lease]:
    """Claim up to params["limit"] due groups, a lease each over all its due events: their advisory
    locks (lock_due_groups) span the next statement (claim_groups), so `db` is a transaction."""
    chosen = db.rows("lock_due_groups", {**params, "scan": params["limit"] * GROUP_SCAN_FACTOR})
    if not chosen:
        return []
    _count_expired(params["queue"], chosen[0]["leases_ended"])
    return _leases(db.rows("claim_groups", {**params, "groups": [row["group_key"] for row in chosen]}))


class LeaseStore(EngineStore):
    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        # Per queue: whether its last ungrouped claim saw group work (tickler_groups_due, returned
        # with the claim's rows). A group claim runs only then, or when the claim before it in the
        # same round sees some: a queue without groups pays no statement for them (migration 0068).
        self._groups_due: dict[str, bool] = {}

    def claim(self, queue: Queue, **options: Any) -> list[Lease]:
        """The leases of claim_within_limits(queue, **options) (worker, limit, ...)."""
        return self.claim_within_limits(queue, **options).leases

    def claim_within_limits(
        self,
        queue: Queue,
        *,
        worker: str,
        limit: int,
        lease_seconds: float | None = None,
        groups_first: bool = False,
        now: datetime | None = None,
    ) -> Claim:
        """Claim up to `limit` leases of due events of `queue`.

        Ungrouped events get a lease each (one statement); each due group gets one lease over all
        its due events (one transaction: its advisory locks span two statements).
        `groups_first` alternates which kind is served first, so neither can starve the other.

        One path for every queue; flow control is a condition in it. A queue that is paused or has
        max_in_flight / rate_per_second / max_in_flight_per_key is claimed in one transaction under
        its flow lock, which every process takes: the room is counted and used there (flow_room).
        Any other queue's statements run alone: its ungrouped claim is one autocommit statement
        (with fair_share, round robin across fairness keys), and a group claim opens a
        transaction of its own, only when the queue has group work. Those statements refuse a
        paused or limited queue themselves (and the plain one a fair queue), so a caller holding
        stale settings can claim nothing it should not.
        """
        seconds = lease_seconds if lease_seconds is not None else queue.lease_seconds
        limited = queue.flow_limited
        alone = _Statements(self.engine)
        # limited: every statement in one transaction, under the flow lock; else each alone
        with alone.transaction("flow_room", {"queue": queue.name}) if limited else nullcontext(alone) as db:
            room = _Room.hold(db, queue.name, now) if limited else _Room.unlimited(queue, now)
            claim = self._claim(db, room, worker, limit, seconds, groups_first, now)
        if claim.leases:
            metrics.CLAIM_BATCH.labels(queue.name).observe(len(claim.leases))
        return claim

    def _claim(
        self,
        db: _Statements,
        room: _Room,
        worker: str,
        limit: int,
        seconds: float,
        groups_first: bool,
        now: datetime | None,
    ) -> Claim:
        settings = room.settings
        if settings.paused:  # read under the flow lock (a queue without limits is never paused)
            return Claim([], paused=True, queue=settings)
        params = {
            "queue": settings.name,
            "worker": worker,
            "lease_seconds": seconds,
            "now": room.at,
            "flow": room.limited,
            "cap": settings.max_in_flight_per_key,
        }
        leases: list[Lease] = []
        # Whether the queue has group work, as its last ungrouped claim saw (unknown: look). A group
        # claim runs only then: a queue without groups pays no statement for them (migration 0068).
        groups_due = self._groups_due.get(settings.name, True)
        for kind in ("groups", "events") if groups_first else ("events", "groups"):
            remaining = room.left(limit, leases)
            if remaining <= 0:
                break
            if kind == "events":
                claimed, groups_due = _claim_events(db, {**params, "limit": remaining}, settings, fixed_at=now)
                leases.extend(claimed)
            elif groups_due:
                with db.transaction("lock_due_groups", params) as tx:  # its advisory locks span two statements
                    leases.extend(_claim_groups(tx, {**params, "limit": remaining}))
        self._groups_due[settings.name] = groups_due
        if not room.limited:
            return Claim(leases)
        return room.record(db, leases, limit)

    def ack(
        self,
        lease_ids: Sequence[str],
        *,
        queues: Sequence[str] | None = None,
        now: datetime | None = None,
        trace_ids: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Finish these leases as delivered (only leases of `queues`, when given); return
        {lease_id: queue} of those that were live. `trace_ids`: the trace of each lease's
        attempt, kept in its timeline entry."""
        if not lease_ids:
            return {}
        params = {
            "lease_ids": list(lease_ids),
            "queues": None if queues is None else list(queues),
            "now": now,
            "trace_ids": json.dumps(dict(trace_ids)) if trace_ids else None,
        }
        # One autocommit statement on the driver: the finisher's batched acks, a row per lease.
        rows = driver_rows(self.engine, driver_sql("ack_leases"), params, tuples=True)
        done: dict[str, str] = {}
        delivered: dict[str, int] = {}
        for lease_id, queue, events in rows:
            done[str(lease_id)] = queue
            delivered[queue] = delivered.get(queue, 0) + events
        for queue, events in delivered.items():  # one counter update per queue, not per lease
            metrics.DELIVERED.labels(queue).inc(events)
        return done

    def ack_one(
        self,
        lease_id: str,
        *,
        queues: Sequence[str] | None = None,
        now: datetime | None = None,
        trace_id: str | None = None,
    ) -> str:
        done = self.ack([lease_id], queues=queues, now=now, trace_ids={lease_id: trace_id} if trace_id else None)
        if lease_id not in done:
            raise StaleLease("The lease expired, was finished, or never existed.")
        return done[lease_id]

    def nack(
        self,
        lease_id: str,
        *,
        error: str,
        retry_in_seconds: float | None = None,
        dead: bool = False,
        now: datetime | None = None,
        trace_id: str | None = None,
    ) -> FailResult:
        """Record a failed attempt for every event of the lease (see fail_lease in queries.sql)."""
        # PostgreSQL text cannot hold NUL, and error texts come from handlers and receivers
        # (exception messages, binary replies): a NUL must not make the failure unrecordable.
        error = error.replace("\x00", "\ufffd")
        params = {
            "lease_id": lease_id,
            "error": error,
            "retry_in_seconds": retry_in_seconds,
            "dead": dead,
            "now": now,
            "trace_id": trace_id,
        }
        rows = self.rows("fail_lease", params)
        if not rows:
            raise StaleLease("The lease expired, was finished, or never existed.")
        retried = [r for r in rows if not r["is_dead"]]
        metrics.FAILED.labels(rows[0]["queue"]).inc()
        if len(rows) > len(retried):
            metrics.DEAD.labels(rows[0]["queue"]).inc(len(rows) - len(retried))
        return FailResult(
            queue=rows[0]["queue"],
            dead=len(rows) - len(retried),
            retried=len(retried),
            retry_at=min((r["schedule_on"] for r in retried), default=None),
        )

    def extend(self, lease_id: str, *, seconds: float, now: datetime | None = None) -> datetime:
        """Keep a live lease for `seconds` more from now; return its new expiry."""
        rows = self.rows("extend_lease", {"lease_id": lease_id, "seconds": seconds, "now": now})
        if not rows:
            raise StaleLease("The lease expired, was finished, or never existed.")
        expires: datetime = rows[0]["lease_expires_on"]
        return expires

    def release(self, lease_ids: Sequence[str], *, actor: str, now: datetime | None = None) -> int:
        """Give live leases back unfinished; their events are claimable at once."""
        if not lease_ids:
            return 0
        return len(self.rows("release_leases", {"lease_ids": list(lease_ids), "actor": actor, "now": now}))

    def queue_of(self, lease_id: str, *, now: datetime | None = None) -> str | None:
        """The queue of a live lease, or None."""
        rows = self.rows("lease_queue", {"lease_id": lease_id, "now": now}, tuples=True)
        return rows[0][0] if rows else None

    def fate(self, lease_id: str) -> str:
        """What became of a lease that is no longer live (see lease_fate): `expired` or `unknown`."""
        rows = self.rows("lease_fate", {"lease_id": lease_id}, tuples=True)
        return (rows[0][0] if rows else None) or "unknown"

    def plan_sleep(self, queues: Sequence[str], *, max_seconds: float) -> SleepPlan:
        """Before a dispatcher sleeps: find its next due time and publish when it will look again.

        The queue rows are locked first (waiting for writers that hold them), and the next due
        time is read in a later statement; see tickler_queue.next_wake for why this loses no
        wake-up. An event already due was committed after the caller's last claim, or is held by
        a transaction that is about to commit: look again almost at once.
        """
        names = sorted(set(queues))
        # First a plain read: when the next event is due within SHORT_SLEEP, sleep until it
        # without the handshake, whose row lock and write cost a commit (a WAL flush) on every
        # claim cycle at high rates. An earlier event written meanwhile waits at most that long.
        [peek] = self.rows("next_due", {"queues": names})
        if peek["next_on"] is not None and peek["next_on"] - peek["db_now"] <= SHORT_SLEEP:
            wake_at = max(peek["next_on"], peek["db_now"] + DUE_NOW_RETRY)
            return SleepPlan(db_now=peek["db_now"], next_due=peek["next_on"], wake_at=wake_at)
        with _Statements(self.engine).transaction("prepare_to_sleep", {"queues": names}) as db:
            db.rows("prepare_to_sleep", {"queues": names})
            [found] = db.rows("next_due", {"queues": names})
            db_now: datetime = found["db_now"]
            next_due: datetime | None = found["next_on"]
            wake_at = db_now + timedelta(seconds=max_seconds)
            if next_due is not None:
                wake_at = min(wake_at, max(next_due, db_now + DUE_NOW_RETRY))
            db.rows("set_next_wake", {"queues": names, "next_wake": wake_at})
        return SleepPlan(db_now=db_now, next_due=next_due, wake_at=wake_at)

    def expire(
        self, *, queue: str | None = None, actor: str = "tickler", now: datetime | None = None
    ) -> dict[str, int]:
        """End every lease whose time is up (of one queue, or all); return {queue: events released or dead}."""
        rows = self.rows("expire_leases", {"queue": queue, "actor": actor, "now": now})
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["queue"]] = counts.get(row["queue"], 0) + 1
        for name, n in counts.items():
            _count_expired(name, n)
        return counts


def _count_expired(queue: str, events: int) -> None:
    """Events whose expired lease was ended (by the reaper, or by a claim that met it)."""
    if events:
        metrics.LEASE_EXPIRED.labels(queue).inc(events)
