"""What the dashboard reads beyond the API's calls: a key's timeline a page at a time, how many
events a search matches (counted up to a cap), and the page before a search page.

Named SQL in `ui_reads.sql`; the search-based reads reuse the event search's own query
(scheduler/store/search.py), so they match exactly what the pages list. All run with sql.run, on
a pooled connection (db.driver_rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.models import Event, TimelineEntry
from tickler.scheduler.store import search
from tickler.scheduler.store.base import EngineStore, sql_file

_sql = sql_file("ui_reads.sql")


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
    """The fairness keys with the most due events, among the first `seen` due events: ungrouped
    ones in claim order and grouped ones by due time, each read bounded by the scan."""

    keys: list[tuple[str | None, int]]  # (fairness key or None for none, due events), largest first
    seen: int
    more: bool  # there are more due events than were looked at
    # Of each listed key's due events, how many are in groups (claimed with their group).
    grouped: dict[str | None, int] = field(default_factory=dict)


class UIReads(EngineStore):
    def fair_backlogs(
        self, queue: str, *, keys: int = 10, scan: int = 100_000, now: datetime | None = None
    ) -> FairBacklogs:
        """The `keys` fairness keys with the largest due backlog among the queue's first `scan`
        due ungrouped events and first `scan` due grouped ones (bounded reads at any backlog)."""
        params = {"queue": queue, "keys": keys, "scan": scan, "now": now}
        rows = self.reads.read(lambda engine: driver_rows(engine, _sql("fair_backlogs"), params))
        seen = int(rows[0]["seen"]) if rows else 0
        grouped_seen = int(rows[0]["grouped_seen"]) if rows else 0
        more = seen - grouped_seen >= scan or grouped_seen >= scan
        listed = [(row["fairness_key"] or None, int(row["due"])) for row in rows]
        grouped = {row["fairness_key"] or None: int(row["grouped"]) for row in rows if row["grouped"]}
        return FairBacklogs(listed, seen, more, grouped)

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
        unordered = replace(where, limit=cap + 1, by_change=False)  # the order changes no count; by due time is cheap
        listed = search.build_query(queue, unordered, now).subquery()
        counted = search.statement(sa.select(sa.func.count()).select_from(listed), self.engine.dialect)
        [[n]] = self.reads.read(lambda engine: driver_rows(engine, *counted, tuples=True))
        return Count(min(int(n), cap), int(n) > cap)

    def page_before(
        self, queue: str, where: search.SearchFilter, before: tuple[datetime, int], *, now: datetime | None = None
    ) -> list[Event]:
        """The `where.limit` events just before `before` in the search's order, nearest first
        (the previous page, read backwards)."""
        backwards = replace(where, descending=not where.descending, after=before)
        rows = self.reads.read(lambda engine: search.rows(engine, queue, backwards, now))
        return [Event.from_row(row) for row in rows]
