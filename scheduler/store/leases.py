"""Leases: claim due events (one by one, or a whole group at once), then ack, nack, extend or
release them. A lease is identified by its id, and only a live lease can be finished: a lease
that expired and was claimed again can never be finished by its old holder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from scheduler.errors import StaleLease
from scheduler.models import Event, Lease, Queue
from scheduler.sql import q

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


class LeaseStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        # Single statements run without BEGIN / COMMIT round trips.
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    def claim(
        self,
        queue: Queue,
        *,
        worker: str,
        limit: int,
        lease_seconds: float | None = None,
        groups_first: bool = False,
        now: datetime | None = None,
    ) -> list[Lease]:
        """Claim up to `limit` leases of due events of `queue`.

        Ungrouped events get a lease each (one statement); each due group gets one lease over all
        its due events (one transaction: its advisory locks span two statements).
        `groups_first` alternates which kind is served first, so neither can starve the other.
        """
        seconds = lease_seconds if lease_seconds is not None else queue.lease_seconds
        leases: list[Lease] = []
        for kind in ("groups", "events") if groups_first else ("events", "groups"):
            remaining = limit - len(leases)
            if remaining <= 0:
                break
            if kind == "events":
                params = {
                    "queue": queue.name,
                    "worker": worker,
                    "limit": remaining,
                    "lease_seconds": seconds,
                    "now": now,
                }
                with self.autocommit.connect() as conn:
                    rows = conn.execute(q("claim_events"), params).mappings().all()
                leases.extend(_leases(rows))
            else:
                with self.autocommit.connect() as conn:
                    if not conn.execute(q("has_due_groups"), {"queue": queue.name, "now": now}).scalar():
                        continue  # most queues have no groups: spare them the transaction
                with self.engine.begin() as conn:
                    leases.extend(self._claim_groups(conn, queue.name, worker, remaining, seconds, now))
        return leases

    @staticmethod
    def _claim_groups(
        conn: sa.Connection, queue: str, worker: str, limit: int, seconds: float, now: datetime | None
    ) -> list[Lease]:
        groups = (
            conn.execute(
                q("lock_due_groups"),
                {"queue": queue, "limit": limit, "scan": limit * GROUP_SCAN_FACTOR, "now": now},
            )
            .scalars()
            .all()
        )
        if not groups:
            return []
        rows = (
            conn.execute(
                q("claim_groups"),
                {"queue": queue, "groups": list(groups), "worker": worker, "lease_seconds": seconds, "now": now},
            )
            .mappings()
            .all()
        )
        return _leases(rows)

    def ack(
        self, lease_ids: Sequence[str], *, queues: Sequence[str] | None = None, now: datetime | None = None
    ) -> dict[str, str]:
        """Finish these leases as delivered (only leases of `queues`, when given); return
        {lease_id: queue} of those that were live."""
        if not lease_ids:
            return {}
        params = {"lease_ids": list(lease_ids), "queues": None if queues is None else list(queues), "now": now}
        with self.autocommit.connect() as conn:
            rows = conn.execute(q("ack_leases"), params).mappings().all()
        return {str(row["lease_id"]): row["queue"] for row in rows}

    def ack_one(self, lease_id: str, *, queues: Sequence[str] | None = None, now: datetime | None = None) -> str:
        done = self.ack([lease_id], queues=queues, now=now)
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
    ) -> FailResult:
        """Record a failed attempt for every event of the lease (see fail_lease in queries.sql)."""
        # PostgreSQL text cannot hold NUL, and error texts come from handlers and receivers
        # (exception messages, binary replies): a NUL must not make the failure unrecordable.
        error = error.replace("\x00", "\ufffd")
        with self.autocommit.connect() as conn:
            rows = (
                conn.execute(
                    q("fail_lease"),
                    {
                        "lease_id": lease_id,
                        "error": error,
                        "retry_in_seconds": retry_in_seconds,
                        "dead": dead,
                        "now": now,
                    },
                )
                .mappings()
                .all()
            )
        if not rows:
            raise StaleLease("The lease expired, was finished, or never existed.")
        retried = [r for r in rows if not r["is_dead"]]
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
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            queue: str | None = conn.execute(q("lease_queue"), {"lease_id": lease_id, "now": now}).scalar()
        return queue

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
        with self.autocommit.connect() as conn:
            peek = conn.execute(q("next_due"), {"queues": names}).mappings().one()
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
            rows = (
                conn.execute(q("expire_leases"), {"queue": queue, "item_key": None, "actor": actor, "now": now})
                .mappings()
                .all()
            )
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["queue"]] = counts.get(row["queue"], 0) + 1
        return counts
