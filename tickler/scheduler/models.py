"""The values the store hands out: events, queues, timeline entries, principals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only named in annotations: the command line imports models without SQLAlchemy
    from sqlalchemy.engine import RowMapping


@dataclass(frozen=True)
class Event:
    id: int
    queue: str
    item_key: str
    group_key: str | None
    schedule_on: datetime
    data: dict[str, Any]
    status: str
    enqueued_on: datetime
    enqueued_by: str
    dequeued_on: datetime | None
    dequeued_by: str | None
    claimed_on: datetime | None
    claimed_by: str | None
    redeliver_count: int
    max_attempts: int
    last_error: str | None
    version: int
    # SPEC §10: claims take higher priority first; fair-share queues round-robin fairness keys.
    priority: int = 0
    fairness_key: str | None = None
    lease_id: str | None = None
    lease_expires_on: datetime | None = None
    # The W3C trace context its producer sent (SPEC §11); shown only in pull claims.
    traceparent: str | None = None
    tracestate: str | None = None
    # When it last changed (every change bumps version): a finished event's last change is its finish.
    changed_on: datetime | None = None

    @classmethod
    def from_row(cls, row: RowMapping | Mapping[str, Any]) -> Event:
        return cls(
            id=row["id"],
            queue=row["queue"],
            item_key=row["item_key"],
            group_key=row["group_key"],
            schedule_on=row["schedule_on"],
            data=row["data"],
            status=row["status"],
            enqueued_on=row["enqueued_on"],
            enqueued_by=row["enqueued_by"],
            dequeued_on=row["dequeued_on"],
            dequeued_by=row["dequeued_by"],
            claimed_on=row["claimed_on"],
            claimed_by=row["claimed_by"],
            redeliver_count=row["redeliver_count"],
            max_attempts=row["max_attempts"],
            last_error=row["last_error"],
            version=row["version"],
            # stored as '' when the event has none (an index and a NOT NULL column need no NULL case)
            priority=row.get("priority", 0),
            fairness_key=row.get("fairness_key") or None,
            lease_id=str(row["lease_id"]) if row["lease_id"] is not None else None,
            lease_expires_on=row["lease_expires_on"],
            # .get: a row read before migration 0040 ran, or a query that does not select them
            traceparent=row.get("traceparent"),
            tracestate=row.get("tracestate"),
            # history keeps no changed_on of its own (migration 0079); .get: a query that does not select it
            changed_on=row["dequeued_on"] or row.get("changed_on") or row["enqueued_on"],
        )


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    action: str
    actor: str
    event_id: int | None  # None: an entry of a recurring schedule (schedule_created, ...)
    schedule_on: datetime | None
    details: dict[str, Any]


@dataclass(frozen=True)
class Queue:
    name: str
    delivery_mode: str
    webhook_url: str | None
    webhook_timeout_seconds: float | None
    signing_secret: str | None
    previous_signing_secret: str | None
    previous_secret_until: datetime | None
    lease_seconds: float
    max_attempts: int
    backoff_initial_seconds: float
    backoff_max_seconds: float
    backoff_multiplier: float
    created_on: datetime
    updated_on: datetime
    # A paused queue delivers nothing; scheduling, moving and cancelling go on (SPEC §7).
    paused: bool = False
    # Flow control (SPEC §6): enforced by the claims themselves, in the database.
    max_in_flight: int | None = None
    rate_per_second: float | None = None
    # History (SPEC §9): finished events and timeline entries are kept this many days, removed a
    # whole day at a time; with archive_before_prune, only days the archive has written.
    retention_days: int = 30
    archive_before_prune: bool = False
    # Fair share (SPEC §10): round robin across fairness keys; at most this many leases per key.
    fair_share: bool = False
    max_in_flight_per_key: int | None = None

    @property
    def flow_limited(self) -> bool:
        """Whether claims of this queue go through its flow lock (see flow_room in queries.sql). Fair
        share alone does not: its cursor is a hint, not a limit (tickler_claim_events)."""
        return (
            self.paused
            or self.max_in_flight is not None
            or self.rate_per_second is not None
            or self.max_in_flight_per_key is not None
        )

    @property
    def claim_path(self) -> str:
        """Which claim statements serve this queue: "limited" (under the flow lock), "fair" (round
        robin, no lock) or "plain". Each refuses a queue of another path."""
        if self.flow_limited:
            return "limited"
        return "fair" if self.fair_share else "plain"

    @property
    def fair_shared(self) -> bool:
        """Whether ungrouped claims go round robin across fairness keys (claim_events_fair): with
        fair_share, and with max_in_flight_per_key (a key at its cap is passed over, not waited on)."""
        return self.fair_share or self.max_in_flight_per_key is not None

    @classmethod
    def from_row(cls, row: RowMapping) -> Queue:
        # A setting newer than the database's schema (a worker started before its migration ran)
        # takes its default until the migration adds it.
        return cls(**{name: row[name] for name in cls.__dataclass_fields__ if name in row})


@dataclass(frozen=True)
class Principal:
    """Who is calling: a client service, the queues it may use, and whether it is an admin."""

    name: str
    is_admin: bool
    queues: frozenset[str]

    def can_use(self, queue: str) -> bool:
        return self.is_admin or queue in self.queues


@dataclass(frozen=True)
class NewEvent:
    """An event as a client asks for it, already checked against the rules."""

    item_key: str
    data: dict[str, Any]
    group_key: str | None = None
    schedule_on: datetime | None = None
    delay_seconds: float | None = None
    max_attempts: int | None = None
    priority: int | None = None
    fairness_key: str | None = None

    @classmethod
    def of(cls, loaded: Mapping[str, Any]) -> NewEvent:
        """The event among fields already checked (a request's other fields, such as
        on_conflict, are not the event's)."""
        names = _NEW_EVENT_FIELDS
        return cls(**{name: value for name, value in loaded.items() if name in names})


_NEW_EVENT_FIELDS = frozenset(field.name for field in fields(NewEvent))


@dataclass(frozen=True)
class ScheduleResult:
    """What happened to one requested event: created, ignored, replaced or rejected."""

    item_key: str
    outcome: str
    id: int | None


@dataclass(frozen=True)
class Lease:
    """A claim on one event, or on all due events of one group, until `expires_at`."""

    lease_id: str
    queue: str
    group_key: str | None
    expires_at: datetime
    claimed_by: str
    events: tuple[Event, ...]
