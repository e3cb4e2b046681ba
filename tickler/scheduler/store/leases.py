"""Leases: claim due events (one by one, or a whole group at once), then ack, nack, extend or
release them. A lease is identified by its id, and only a live lease can be finished: a lease
that expired and was claimed again can never be finished by its old holder. The delivery
metrics (scheduler.metrics) are counted here, once, whoever calls: dispatcher, pull API, reaper."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tickler.scheduler import metrics
from tickler.scheduler.db import driver_rows
from tickler.scheduler.errors import StaleLease
from tickler.scheduler.models import Event, Lease, Queue
from tickler.scheduler.sql import driver_sql, q
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


@dataclass(frozen=True)
class Fairness:
    """How a limited claim shares the queue among fairness keys (SPEC §10)."""

    round_robin: bool  # ungrouped events through claim_events_fair
    cap: int | None  # max_in_flight_per_key
    claimed_at: datetime | None = None  # a time the caller fixed (tests); None: the database's clock


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


def _leases(rows: Sequence[sa.RowMapping]) -> list[Lease]:
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


class LeaseStore(EngineStore):
    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        # Per queue: whether its last fast-path claim saw group work (tickler_groups_due, returned
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

        A queue that is paused or has max_in_flight / rate_per_second / max_in_flight_per_key is
        claimed in one transaction under its flow lock, which every process takes: the room is
        counted and used there (flow_room). Other queues keep the fast path: no lock, no extra
        write; with fair_share, its ungrouped events go round robin (claim_events_round_robin).
        The fast statements refuse a paused or limited queue themselves (and the plain one a fair
        queue), so a caller holding stale settings can claim nothing it should not.
        """
        seconds = lease_seconds if lease_seconds is not None else queue.lease_seconds
        if queue.flow_limited:
            with self.engine.begin() as conn:
                claim = self._claim_limited(conn, queue.name, worker, limit, seconds, groups_first, now)
        else:
            fair = queue.fair_share
            claim = Claim(self._claim_fast(queue.name, worker, limit, seconds, groups_first, now, fair=fair))
        if claim.leases:
            metrics.CLAIM_BATCH.labels(queue.name).observe(len(claim.leases))
        return claim

    def _claim_fast(
        self,
        queue: str,
        worker: str,
        limit: int,
        seconds: float,
        groups_first: bool,
        now: datetime | None,
        *,
        fair: bool = False,
    ) -> list[Lease]:
        leases: list[Lease] = []
        # Whether the queue has group work, as the last ungrouped claim of it saw (unknown: look).
        groups_due = self._groups_due.get(queue, True)
        for kind in ("groups", "events") if groups_first else ("events", "groups"):
            remaining = limit - len(leases)
            if remaining <= 0:
                break
            if kind == "events":
                claimed, groups_due = self._claim_events_fast(queue, worker, remaining, seconds, now, fair=fair)
                leases.extend(claimed)
            elif groups_due:  # most queues have no groups: spare them the transaction
                with self.engine.begin() as conn:  # its advisory locks span two statements
                    leases.extend(self._claim_kind(conn, kind, queue, worker, remaining, seconds, now, flow=False))
        self._groups_due[queue] = groups_due
        return leases

    def _claim_events_fast(
        self, queue: str, worker: str, limit: int, seconds: float, now: datetime | None, *, fair: bool
    ) -> tuple[list[Lease], bool]:
        """The fast path's ungrouped claim: one autocommit statement (claim_events, or
        claim_events_round_robin for a fair queue) run on the driver, its rows read as dicts — the
        claim runs once per batch on every dispatcher, and SQLAlchemy's statement and per-row result
        processing was most of its Python. With the leases, whether the queue has group work
        (tickler_groups_due, asked by the same statement)."""
        params = {
            "queue": queue,
            "worker": worker,
            "limit": limit,
            "lease_seconds": seconds,
            "now": now,
            "flow": False,
            "cap": None,
        }
        rows = driver_rows(self.engine, driver_sql("claim_events_round_robin" if fair else "claim_events"), params)
        # the expired leases it ended: of events it claimed, and of events that died of them
        _count_expired(queue, sum(1 for row in rows if row["lease_ended"]) + (rows[0]["died"] if rows else 0))
        return _leases([row for row in rows if row["id"] is not None]), bool(rows and rows[0]["groups_due"])

    def _claim_limited(
        self,
        conn: sa.Connection,
        queue: str,
        worker: str,
        limit: int,
        seconds: float,
        groups_first: bool,
        now: datetime | None,
    ) -> Claim:
        conn.execute(q("flow_lock"), {"queue": queue})
        room = conn.execute(q("flow_room"), {"queue": queue, "now": now}).mappings().one()
        settings = Queue.from_row(room)
        if room["paused"]:
            return Claim([], paused=True, queue=settings)
        at: datetime = room["db_now"]  # claimed_on follows the order of the flow lock
        fairness = Fairness(settings.fair_shared, settings.max_in_flight_per_key, claimed_at=now)
        lease_room = limit if room["lease_room"] is None else min(limit, room["lease_room"])
        event_room = room["event_room"]
        leases: list[Lease] = []
        for kind in ("groups", "events") if groups_first else ("events", "groups"):
            remaining = lease_room - len(leases)
            if event_room is not None:
                remaining = min(remaining, event_room - sum(len(lease.events) for lease in leases))
            if remaining <= 0:
                break
            if (
                kind == "groups"
                and not conn.execute(q("has_due_groups"), {"queue": queue, "now": at, "flow": True}).scalar()
            ):
                continue  # most queues have no groups: one probe instead of the group claim's statements
            leases.extend(
                self._claim_kind(conn, kind, queue, worker, remaining, seconds, at, flow=True, fairness=fairness)
            )
        taken = sum(len(lease.events) for lease in leases)
        if event_room is not None and taken:
            conn.execute(q("flow_record"), {"queue": queue, "at": at, "events": taken})
        room_in: float | None = None
        if event_room is not None and taken >= event_room:
            # The window is full: it has room again when its oldest claim (maybe this one) leaves.
            room_at = room["rate_room_at"] or at + timedelta(seconds=room["window_seconds"])
            room_in = max(0.0, (room_at - at).total_seconds())
        if room["lease_room"] is not None and len(leases) >= room["lease_room"]:
            room_in = FLOW_POLL_SECONDS if room_in is None else max(room_in, FLOW_POLL_SECONDS)
        # Due events left behind by a capped claim belong to keys at their cap: their leases end in
        # other processes, which do not tell this one (as for max_in_flight). Nothing left: sleep.
        held_by_cap = fairness.cap is not None and len(leases) < limit and room_in is None
        if held_by_cap and conn.execute(q("has_due_events"), {"queue": queue, "now": at}).scalar():
            room_in = FLOW_POLL_SECONDS
        return Claim(leases, room_in=room_in, queue=settings)

    @staticmethod
    def _claim_kind(
        conn: sa.Connection,
        kind: str,
        queue: str,
        worker: str,
        limit: int,
        seconds: float,
        now: datetime | None,
        *,
        flow: bool,
        fairness: Fairness | None = None,
    ) -> list[Lease]:
        """Claim up to `limit` leases of one kind: "events" (ungrouped, a lease each) or "groups"."""
        cap = fairness.cap if fairness is not None else None
        params = {
            "queue": queue,
            "worker": worker,
            "limit": limit,
            "lease_seconds": seconds,
            "now": now,
            "flow": flow,
            "cap": cap,
        }
        if kind == "events" and fairness is not None and fairness.round_robin:
            # Under the flow lock only (the pick's cursor and per-key room are the queue's). Leases
            # whose time is up end first, as the reaper ends them: their events are pending again.
            ended = conn.execute(q("expire_leases"), {"queue": queue, "actor": "tickler", "now": now}).all()
            _count_expired(queue, len(ended))
            fair = {**params, "claimed_at": fairness.claimed_at}
            return _leases(conn.execute(q("claim_events_fair"), fair).mappings().all())
        if kind == "events":  # under the flow lock (the fast path: _claim_events_fast)
            rows = conn.execute(q("claim_events"), params).mappings().all()
            # the expired leases it ended: of events it claimed, and of events that died of them
            _count_expired(queue, sum(1 for row in rows if row["lease_ended"]) + rows[0]["died"])
            return _leases([row for row in rows if row["id"] is not None])
        chosen = conn.execute(q("lock_due_groups"), {**params, "scan": limit * GROUP_SCAN_FACTOR}).mappings().all()
        if not chosen:
            return []
        _count_expired(queue, chosen[0]["leases_ended"])
        groups = [row["group_key"] for row in chosen]
        return _leases(conn.execute(q("claim_groups"), {**params, "groups": groups}).mappings().all())

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
        with self.engine.begin() as conn:
            row = (
                conn.execute(q("extend_lease"), {"lease_id": lease_id, "seconds": seconds, "now": now})
                .mappings()
                .first()
            )
        if row is None:
            raise StaleLease("The lease expired, was finished, or never existed.")
        expires: datetime = row["lease_expires_on"]
        return expires

    def release(self, lease_ids: Sequence[str], *, actor: str, now: datetime | None = None) -> int:
        """Give live leases back unfinished; their events are claimable at once."""
        if not lease_ids:
            return 0
        with self.engine.begin() as conn:
            rows = conn.execute(q("release_leases"), {"lease_ids": list(lease_ids), "actor": actor, "now": now}).all()
        return len(rows)

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
        with self.engine.begin() as conn:
            conn.execute(q("prepare_to_sleep"), {"queues": names})
            found = conn.execute(q("next_due"), {"queues": names}).mappings().one()
            db_now: datetime = found["db_now"]
            next_due: datetime | None = found["next_on"]
            wake_at = db_now + timedelta(seconds=max_seconds)
            if next_due is not None:
                wake_at = min(wake_at, max(next_due, db_now + DUE_NOW_RETRY))
            conn.execute(q("set_next_wake"), {"queues": names, "next_wake": wake_at})
        return SleepPlan(db_now=db_now, next_due=next_due, wake_at=wake_at)

    def expire(
        self, *, queue: str | None = None, actor: str = "tickler", now: datetime | None = None
    ) -> dict[str, int]:
        """End every lease whose time is up (of one queue, or all); return {queue: events released or dead}."""
        with self.engine.begin() as conn:
            rows = conn.execute(q("expire_leases"), {"queue": queue, "actor": actor, "now": now}).mappings().all()
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
