"""What the dashboard reads beyond the API's calls: a key's timeline a page at a time, how many
events a search matches (counted up to a cap), and the page before a search page.

Named SQL in `ui_reads.sql`; the search-based reads reuse the event search's own query
(scheduler/store/search.py), so they match exactly what the pages list. All run with sql.run, on
a pooled connection (db.driver_rows).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.models import Event, TimelineEntry
from tickler.scheduler.sql import file_queries
from tickler.scheduler.states import OPEN_STATUSES, OUTCOMES
from tickler.scheduler.store import search
from tickler.scheduler.store.base import EngineStore


def _sql(name: str) -> str:
    """A query of ui_reads.sql in psycopg's placeholders, for sql.run."""
    return file_queries("tickler.scheduler.store", "ui_reads.sql")[name]


@dataclass(frozen=True)
class TimelinePage:
    entries: list[TimelineEntry]  # newest first
    # The `before` of the next (older) page; None on the last page.
    older: int | None


@dataclass(frozen=True)
class Count:
    n: int
    capped: bool  # True: at least `n` match (counting stopped there)


@dataclass(frozen=True)
class FairBacklogs:
    """The fairness keys with the most due events, among the first `seen` due events."""

    keys: list[tuple[str | None, int]]  # (fairness key or None for none, due events), largest first
    seen: int
    more: bool  # there are more due events than were looked at


class UIReads(EngineStore):
    def fair_backlogs(
        self, queue: str, *, keys: int = 10, scan: int = 100_000, now: datetime | None = None
    ) -> FairBacklogs:
        """The `keys` fairness keys with the largest due backlog among the queue's first `scan`
        due events (a bounded read at any backlog)."""
        params = {"queue": queue, "keys": keys, "scan": scan, "now": now}
        rows = self.reads.read(lambda engine: driver_rows(engine, _sql("fair_backlogs"), params))
        seen = int(rows[0]["seen"]) if rows else 0
        return FairBacklogs([(row["fairness_key"] or None, int(row["due"])) for row in rows], seen, seen >= scan)

    def timeline_page(self, queue: str, item_key: str, *, before: int | None, limit: int) -> TimelinePage:
        """At most `limit` timeline rows of a key older than row `before`, newest first."""
        params = {"queue": queue, "item_key": item_key, "before": before, "limit": limit + 1}
        rows = self.reads.read(lambda engine: driver_rows(engine, _sql("timeline_page"), params))
        ids = sorted({row["id"] for row in rows if row["id"] is not None}, reverse=True)
        older = None
        if len(ids) > limit:
            # One row more than asked tells there is another page; it starts that page.
            rows = [row for row in rows if row["id"] != ids[limit]]
            older = ids[limit - 1]
        entries = [
            TimelineEntry(**{k: row[k] for k in ("at", "action", "actor", "event_id", "schedule_on", "details")})
            for row in rows
        ]
        return TimelinePage(entries, older)

    def count(self, queue: str, where: search.SearchFilter, *, cap: int, now: datetime | None = None) -> Count:
        """How many events the search matches from its `after` on, counted up to `cap`."""
        listed = search.build_query(queue, replace(where, limit=cap + 1), now).subquery()
        counted = search.statement(sa.select(sa.func.count()).select_from(listed), self.engine.dialect)
        [[n]] = self.reads.read(lambda engine: driver_rows(engine, *counted, tuples=True))
        return Count(min(int(n), cap), int(n) > cap)

    def page_before(
        self, queue: str, where: search.SearchFilter, before: tuple[datetime, int], *, now: datetime | None = None
    ) -> list[Event]:
        """The `where.limit` events just before `before` in the search's (schedule_on, id) order,
        newest first (the previous page, read backwards)."""
        clock: sa.ColumnElement[datetime] = (
            sa.func.now() if now is None else sa.literal(now, sa.DateTime(timezone=True))
        )
        unbounded = replace(where, after=None)
        parts: list[sa.Select[Any]] = []
        for open_part, statuses in ((True, OPEN_STATUSES), (False, OUTCOMES)):
            if where.statuses & statuses:
                part = search._part(queue, unbounded, clock, open_part=open_part)  # the same filters as the search
                e = part.selected_columns
                parts.append(
                    part.where(sa.tuple_(e.schedule_on, e.id) < sa.tuple_(*before))
                    .order_by(None)
                    .order_by(e.schedule_on.desc(), e.id.desc())
                )
        union = sa.union_all(*(p.subquery().select() for p in parts)).subquery()
        query = sa.select(union).order_by(union.c.schedule_on.desc(), union.c.id.desc()).limit(where.limit)
        statement = search.statement(query, self.engine.dialect)
        rows = self.reads.read(lambda engine: driver_rows(engine, *statement))
        return [Event.from_row(row) for row in rows]
