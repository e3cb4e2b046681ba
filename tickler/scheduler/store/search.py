"""Keyset-paginated search of a queue's events, in (schedule_on, id) order or (changed_on, id)
order (or their reverse).

Filters are optional and combine, so this one query is built with SQLAlchemy Core (bound
parameters only) rather than kept as a named query; `statement` writes it out as SQL text and
parameters, which run as a named query runs (sql.run, on a pooled connection). Open events
(tickler_event) and finished ones (tickler_event_history, by day) live in different tables; each
part is read through its own index and the two are merged.

By last change: no index holds changed_on (one on the open events would cost every claim its HOT
update, one on history every finish an index entry), so the open part is a bounded top-N sort of
the matching open events. A finished event's last change is its finish, so the finished part sorts
by dequeued_on, the history's partition key, a day at a time (_finished_by_change): a page reads
the days it needs, not the queue's whole history.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.models import Event
from tickler.scheduler.rules import format_timestamp, parse_rfc3339
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.states import ALL_STATUSES as ALL_STATUSES  # re-exported: older imports name it here
from tickler.scheduler.states import DUE, OPEN_STATUSES, OUTCOMES, Status

_COLUMNS = (
    "id",
    "queue",
    "item_key",
    "group_key",
    "schedule_on",
    "data",
    "enqueued_on",
    "enqueued_by",
    "dequeued_on",
    "dequeued_by",
    "outcome",
    "claimed_on",
    "claimed_by",
    "lease_id",
    "lease_expires_on",
    "redeliver_count",
    "max_attempts",
    "last_error",
    "version",
    "priority",
    "fairness_key",
)
event = sa.table("tickler_event", *(sa.column(name) for name in (*_COLUMNS, "changed_on")))
finished_event = sa.table("tickler_event_history", *(sa.column(name) for name in _COLUMNS))
# The live leases (migration 0060): in-flight events are found here, no index of events reads a lease.
lease = sa.table("tickler_lease", sa.column("event_id"), sa.column("queue"), sa.column("expires_on"))


class BadCursor(ValueError):
    """The cursor was not one tickler handed out."""


@dataclass(frozen=True)
class SearchFilter:
    statuses: frozenset[str] = field(default_factory=lambda: ALL_STATUSES)
    group_key: str | None = None
    item_key_prefix: str | None = None
    priority: int | None = None
    fairness_key: str | None = None
    due_from: datetime | None = None  # schedule_on >= due_from
    due_until: datetime | None = None  # schedule_on <= due_until
    descending: bool = False  # latest first
    by_change: bool = False  # by changed_on (when each event last changed), not schedule_on
    limit: int = 100
    # The cursor: the (schedule_on or changed_on, id) the page follows, in the order the search runs.
    after: tuple[datetime, int] | None = None

    def position(self, event: Event) -> tuple[datetime, int]:
        """Where `event` stands in this search's order (what a cursor after it holds)."""
        when = event.changed_on if self.by_change else event.schedule_on
        assert when is not None  # Event.from_row always gives changed_on
        return when, event.id

    def cursor_after(self, event: Event) -> str:
        return encode_cursor(*self.position(event))


# The orders a search takes, by the API's `sort` values.
SORTS = ("due", "-due", "changed", "-changed")


def sort_order(sort: str) -> dict[str, bool]:
    """SearchFilter's order fields for one of SORTS."""
    if sort not in SORTS:
        raise ValueError(f"not an order: one of {', '.join(SORTS)}")
    return {"descending": sort.startswith("-"), "by_change": sort.lstrip("-") == "changed"}


def encode_cursor(schedule_on: datetime, event_id: int) -> str:
    raw = f"{format_timestamp(schedule_on)}|{event_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, _, event_id = raw.partition("|")
        after = parse_rfc3339(when), int(event_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadCursor("Not a cursor from a previous page.") from None
    if not 0 <= after[1] < 2**63:  # ids are bigint; a larger one would fail in the query
        raise BadCursor("Not a cursor from a previous page.")
    return after


def prefix_end(prefix: str) -> str | None:
    """The smallest string after every string that starts with `prefix`, in code point order
    (which is the "C" collation's byte order for UTF-8); None when there is none."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:  # surrogates cannot be stored; skip past them
                nxt = 0xE000
            return "".join(chars) + chr(nxt)
    return None


@dataclass(frozen=True)
class Matching:
    """Which events a bulk operation (cancel_matching, retry_matching) touches: a group and/or a
    key prefix. One of them is needed: a bulk call over a whole queue is never implied."""

    group_key: str | None = None
    item_key_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.group_key is None and self.item_key_prefix is None:
            raise ValueError("a bulk operation needs a group_key or an item_key_prefix")

    def params(self) -> dict[str, str | None]:
        """The bind parameters of the bulk statements: the prefix as the range [prefix, prefix_end)."""
        prefix = self.item_key_prefix
        return {"group_key": self.group_key, "prefix": prefix, "prefix_end": prefix_end(prefix) if prefix else None}


Window = tuple[datetime | None, datetime | None]  # [from, until) of dequeued_on; None: unbounded


def _part(
    queue: str, where: SearchFilter, now: sa.ColumnElement[datetime], *, open_part: bool, window: Window = (None, None)
) -> sa.Select[Any]:
    table = event if open_part else finished_event
    e = table.c
    status = sa.func.tickler_status(e.outcome, e.lease_expires_on, now)
    changed = e.changed_on if open_part else e.dequeued_on  # a finished event last changed when it finished
    columns = [c for c in table.c if c.name != "changed_on"]
    query = sa.select(*columns, changed.label("changed_on"), status.label("status")).where(e.queue == queue)
    if open_part:
        query = query.where(e.dequeued_on.is_(None))
        wanted = where.statuses & (OPEN_STATUSES | {DUE})
        if Status.PENDING in wanted:
            wanted -= {DUE}
        unleased = sa.not_(sa.func.coalesce(e.lease_expires_on > now, False))
        if wanted == {Status.PENDING}:
            query = query.where(unleased)
        elif wanted == {Status.IN_FLIGHT}:
            leased = sa.select(lease.c.event_id).where(lease.c.queue == queue, lease.c.expires_on > now)
            query = query.where(e.id.in_(leased), e.lease_expires_on > now)
        elif wanted == {DUE}:
            query = query.where(unleased, e.schedule_on <= now)
        elif wanted == {DUE, Status.IN_FLIGHT}:
            query = query.where(sa.or_(sa.and_(unleased, e.schedule_on <= now), e.lease_expires_on > now))
    else:
        query = query.where(e.dequeued_on.is_not(None))
        if window[0] is not None:
            query = query.where(e.dequeued_on >= window[0])
        if window[1] is not None:
            query = query.where(e.dequeued_on < window[1])
        wanted = where.statuses & OUTCOMES
        if wanted != OUTCOMES:
            query = query.where(e.outcome.in_(sorted(wanted)))
    if where.group_key is not None:
        query = query.where(e.group_key == where.group_key)
    if where.priority is not None:
        query = query.where(e.priority == where.priority)
    if where.fairness_key is not None:
        query = query.where(e.fairness_key == sa.literal(where.fairness_key).collate("C"))
    if where.item_key_prefix:
        query = query.where(e.item_key >= sa.literal(where.item_key_prefix).collate("C"))
        end = prefix_end(where.item_key_prefix)
        if end is not None:
            query = query.where(e.item_key < sa.literal(end).collate("C"))
    if where.due_from is not None:
        query = query.where(e.schedule_on >= where.due_from)
    if where.due_until is not None:
        query = query.where(e.schedule_on <= where.due_until)
    key = changed if where.by_change else e.schedule_on
    if where.after is not None:
        position = sa.tuple_(key, e.id)
        query = query.where(
            position < sa.tuple_(*where.after) if where.descending else position > sa.tuple_(*where.after)
        )
    return query.order_by(*_order(key, e.id, where.descending)).limit(where.limit)


def _order(key: Any, event_id: Any, descending: bool) -> tuple[sa.ColumnElement[Any], ...]:
    return (key.desc(), event_id.desc()) if descending else (key, event_id)


def order(columns: Any, where: SearchFilter) -> tuple[sa.ColumnElement[Any], ...]:
    """The search's order by `columns` (a subquery's): (schedule_on or changed_on, id), or its reverse."""
    return _order(columns.changed_on if where.by_change else columns.schedule_on, columns.id, where.descending)


def statement(query: sa.Select[Any], dialect: sa.Dialect) -> tuple[str, dict[str, Any]]:
    """A query built here as db.driver_rows and sql.run take it: its text in psycopg's placeholders
    (as the engine's `dialect` writes it for its own execution, lists of IN expanded) and its bound
    parameters (as the dialect's types bind them)."""
    compiled = query.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    processors = compiled._bind_processors  # those SQLAlchemy applies when it executes the query
    params = {}
    for name, value in compiled.params.items():
        processor = processors.get(name)
        params[name] = processor(value) if callable(processor) else value
    return str(compiled), params


def _finished_by_change(
    queue: str, where: SearchFilter, now: sa.ColumnElement[datetime], days: Sequence[datetime]
) -> sa.Select[Any]:
    """The finished part by last change, a window of history at a time: the windows between `days`
    (the bounds of history's day partitions; before the first and after the last, whatever the
    DEFAULT partition holds), each its own top-N in the search's order, all under one LIMIT.
    PostgreSQL runs the branches of a UNION ALL one after the other and stops once the LIMIT is
    met, so a first page by latest change reads the newest day and no more (a subquery with a
    LIMIT is never run in parallel, which could interleave them). Its rows are not in order."""
    edges: list[datetime | None] = [None, *sorted(set(days)), None]
    windows = list(itertools.pairwise(edges))
    if where.after is not None:  # the windows the cursor is past hold nothing for this page
        at = where.after[0]
        if where.descending:
            windows = [(lo, hi) for lo, hi in windows if lo is None or lo <= at]
        else:
            windows = [(lo, hi) for lo, hi in windows if hi is None or hi > at]
    if where.descending:
        windows.reverse()
    branches = [_part(queue, where, now, open_part=False, window=w).subquery().select() for w in windows]
    return sa.select(sa.union_all(*branches).subquery()).limit(where.limit)


def build_query(
    queue: str, where: SearchFilter, now: datetime | None, days: Sequence[datetime] | None = None
) -> sa.Select[Any]:
    """The search's query. `days`: the bounds of history's day partitions (read_days), which a
    search by last change reads a window at a time; None: history in one top-N sort."""
    clock: sa.ColumnElement[datetime] = sa.func.now() if now is None else sa.literal(now, sa.DateTime(timezone=True))
    parts = []
    if where.statuses & (OPEN_STATUSES | {DUE}):
        parts.append(_part(queue, where, clock, open_part=True))
    windowed = where.by_change and days is not None
    if where.statuses & OUTCOMES:
        finished = _part(queue, where, clock, open_part=False)
        parts.append(_finished_by_change(queue, where, clock, days or []) if windowed else finished)
    if len(parts) == 1 and not windowed:
        return parts[0]
    union = sa.union_all(*(p.subquery().select() for p in parts)).subquery()
    return sa.select(union).order_by(*order(union.c, where)).limit(where.limit)


def read_days(engine: sa.Engine) -> list[datetime]:
    """The bounds of history's day partitions (for build_query's `days`)."""
    return [row[0] for row in driver_rows(engine, driver_sql("history_days"), tuples=True)]


def rows(engine: sa.Engine, queue: str, where: SearchFilter, now: datetime | None) -> list[Any]:
    """The search's rows, read on `engine` (what build_query selects)."""
    days = read_days(engine) if where.by_change and where.statuses & OUTCOMES else None
    return driver_rows(engine, *statement(build_query(queue, where, now, days), engine.dialect))
