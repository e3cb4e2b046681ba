"""What the server answers, as typed, immutable objects (timestamps as aware `datetime`s).

Every object keeps the JSON it was read from in `raw` (not shown in its repr), so fields a newer
server adds are reachable before this client knows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from tickler_client._model import from_json, model, wire

Status = Literal["pending", "in_flight", "delivered", "cancelled", "dead"]
OnConflict = Literal["reject", "ignore", "replace", "debounce"]
CatchUp = Literal["latest", "none", "all"]


def parse_time(value: Any) -> datetime:
    """An RFC 3339 timestamp from the server (always UTC, `Z`) as an aware datetime."""
    return datetime.fromisoformat(str(value))


def _maybe_time(value: Any) -> datetime | None:
    return None if value is None else parse_time(value)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _times(value: Any) -> list[datetime]:
    return [parse_time(t) for t in value or []]


def _counts(value: Any) -> dict[str, int] | None:
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else None


# The fields below are read by `wire(read, missing=...)`: how the JSON value becomes the field's,
# and what stands for a key the answer lacks (none given: the key must be there).


@model
class Event:
    """One scheduled delivery (SPEC §2). `outcome` is set only on answers to `schedule`:
    `created`, `ignored`, `replaced` or `debounced`."""

    id: int = wire(int)
    queue: str = wire(str)
    item_key: str = wire(str)
    group_key: str | None = wire(missing=None)
    schedule_on: datetime = wire(parse_time)
    data: dict[str, Any] = wire(_dict, missing=None)
    status: Status = wire()
    enqueued_on: datetime = wire(parse_time)
    enqueued_by: str = wire(str)
    dequeued_on: datetime | None = wire(_maybe_time, missing=None)
    dequeued_by: str | None = wire(missing=None)
    claimed_on: datetime | None = wire(_maybe_time, missing=None)
    claimed_by: str | None = wire(missing=None)
    redeliver_count: int = wire(int, missing=0)
    max_attempts: int = wire(int, missing=0)
    last_error: str | None = wire(missing=None)
    version: int = wire(int, missing=0)
    outcome: str | None = wire(missing=None, default=None)
    # SPEC §10 (a server before priorities answers without them: the defaults)
    priority: int = wire(int, missing=0, default=0)
    fairness_key: str | None = wire(missing=None, default=None)
    # when it last changed (`version` went up); a server before it answers without: None
    changed_on: datetime | None = wire(_maybe_time, missing=None, default=None)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_open(self) -> bool:
        """Not finished: waiting, due or in flight (the key is taken)."""
        return self.status in ("pending", "in_flight")


def parse_event(body: dict[str, Any]) -> Event:
    return from_json(Event, body)


@dataclass(frozen=True)
class BatchResult:
    """What happened to one item of `schedule_batch`: `created`, `ignored`, `replaced`,
    `debounced` or `rejected` (an open event holds the key; `id` is then that event's)."""

    item_key: str
    outcome: str
    id: int | None


@model
class TimelineEntry:
    """One recorded step in the life of a key: `enqueued`, `rescheduled`, `claimed`, `delivered`, ..."""

    at: datetime = wire(parse_time)
    action: str = wire(str)
    actor: str = wire(str, missing="")
    event_id: int | None = wire(missing=None)
    schedule_on: datetime | None = wire(_maybe_time, missing=None)
    details: dict[str, Any] = wire(_dict, missing=None)


@dataclass(frozen=True)
class Timeline:
    """Every entry of a key, oldest first, across all its occurrences. `archived` says where older
    entries went when the archive job moved them out of the database (else None)."""

    item_key: str
    entries: list[TimelineEntry]
    archived: dict[str, Any] | None = None

    @property
    def actions(self) -> list[str]:
        """The actions alone, in order: handy in tests and logs."""
        return [entry.action for entry in self.entries]


def parse_timeline(body: dict[str, Any]) -> Timeline:
    entries = [from_json(TimelineEntry, e) for e in body.get("entries", [])]
    archived = body.get("archived")
    return Timeline(item_key=str(body["item_key"]), entries=entries, archived=archived)


@dataclass(frozen=True)
class Page:
    """One page of a search; `next_cursor` is None on the last page."""

    events: list[Event]
    next_cursor: str | None


@model
class Lease:
    """A claim on one event, or on all due events of one group. Finish it with `ack` or `nack`
    before `expires_at`, or `extend` it."""

    lease_id: str = wire(str)
    expires_at: datetime = wire(parse_time)
    group_key: str | None = wire(missing=None)
    events: list[Event] = wire(lambda events: [parse_event(e) for e in events], missing=())

    @property
    def lease_seconds(self) -> float:
        """How long the lease was granted for (server time: from the claim to its expiry)."""
        claimed = [e.claimed_on for e in self.events if e.claimed_on is not None]
        return (self.expires_at - min(claimed)).total_seconds() if claimed else 30.0


@dataclass(frozen=True)
class NackResult:
    """After a nack: `retrying` events are due again at `retry_at`; `dead` ones are finished."""

    status: str
    dead: int
    retrying: int
    retry_at: datetime | None


@model
class Queue:
    """A queue's settings; `counts` (by status) only from `get_queue`, `pause_queue` and
    `resume_queue`; `signing_secret` only in the answer that created a webhook queue or rotated
    its secret. `max_in_flight` / `rate_per_second`: None is no limit."""

    name: str = wire(str)
    delivery: dict[str, Any] = wire(_dict, missing=None)
    lease_seconds: float = wire(float, missing=0)
    max_attempts: int = wire(int, missing=0)
    backoff: dict[str, Any] = wire(_dict, missing=None)
    paused: bool = wire(bool, missing=False, default=False)
    max_in_flight: int | None = wire(missing=None, default=None)
    rate_per_second: float | None = wire(missing=None, default=None)
    fair_share: bool = wire(bool, missing=False, default=False)
    max_in_flight_per_key: int | None = wire(missing=None, default=None)
    counts: dict[str, int] | None = wire(_counts, missing=None, default=None)
    signing_secret: str | None = wire(missing=None, default=None)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class DeletedQueue:
    """After `delete_queue`: how many open events it cancelled and how many events went with it."""

    name: str
    cancelled: int
    deleted_events: int


@model
class Schedule:
    """A recurring schedule (SPEC §6): each occurrence is an event keyed `{schedule_key}@{time}`.
    `next_occurrences` are the next ones (UTC); `last_enqueued` the latest occurrence enqueued."""

    schedule_key: str  # this one, `queue` and `last_enqueued`: read by parse_schedule
    queue: str
    cron: str = wire(str, missing="")
    timezone: str = wire(str, missing="UTC")
    data: dict[str, Any] = wire(_dict, missing=None)
    group_key: str | None = wire(missing=None)
    catch_up: str = wire(str, missing="latest")
    paused: bool = wire(bool, missing=False)
    next_occurrences: list[datetime] = wire(_times, missing=None)
    last_enqueued: datetime | None
    created_on: datetime | None = wire(_maybe_time, missing=None, default=None)
    created_by: str | None = wire(missing=None, default=None)
    updated_on: datetime | None = wire(_maybe_time, missing=None, default=None)
    updated_by: str | None = wire(missing=None, default=None)
    version: int = wire(int, missing=0, default=0)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def parse_schedule(body: dict[str, Any], queue: str) -> Schedule:
    last = body.get("last_enqueued")
    if isinstance(last, dict):  # tolerate {"at": ..., "item_key": ...} as well as a bare timestamp
        last = last.get("at") or last.get("occurrence")
    return from_json(
        Schedule,
        body,
        schedule_key=str(body.get("schedule_key") or body.get("key") or ""),
        queue=str(body.get("queue") or queue),
        last_enqueued=_maybe_time(last),
    )


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value or []]


@model
class Token:
    """An API token as admins see it (never the secret itself, except `token` in the answer to
    `create_token`: the one time it is shown). `name` is its principal; `queues` the queues it
    may use (an admin token may use all); `revoked_on` is set once revoked; `last_used_at`: when
    it was last used, to the minute (None: never)."""

    id: int = wire(int)
    name: str = wire(str)
    admin: bool = wire(bool, missing=False)
    queues: list[str] = wire(_strings, missing=None)
    created_on: datetime | None = wire(_maybe_time, missing=None)
    revoked_on: datetime | None = wire(_maybe_time, missing=None)
    last_used_at: datetime | None = wire(_maybe_time, missing=None)
    token: str | None = wire(missing=None, default=None)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _int_counts(value: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}


@model
class Erasure:
    """An erasure as the log keeps it: who asked, when and why, how far it is (`status`:
    pending, running, done or failed) and what it changed (`counts`: open_events,
    finished_events, timeline_entries, archive_rows). The erased values are never in it."""

    id: int = wire(int)
    status: str = wire(str)
    requested_by: str = wire(str)
    requested_at: datetime = wire(parse_time)
    finished_at: datetime | None = wire(_maybe_time, missing=None)
    reason: str = wire(str)
    counts: dict[str, int] = wire(_int_counts, missing=None)
    queues: list[str] | None = wire(lambda v: None if v is None else _strings(v), missing=None, default=None)
    started_at: datetime | None = wire(_maybe_time, missing=None, default=None)
    note: str | None = wire(missing=None, default=None)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
