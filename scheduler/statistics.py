"""The dispatcher's statistics job: ANALYZE the hot tables whose planner statistics are missing
or were taken when the table was a fraction of its size, without waiting for autovacuum
(scheduler/store/statistics.py says why claims need them)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
import structlog

from tickler.scheduler.store import Store

log = structlog.get_logger(__name__)

# A look is one query on pg_class (the files' sizes): cheap enough to make every few seconds, so
# that a burst of events gets its statistics while the dispatchers are still draining it.
INTERVAL_SECONDS = 1.0
# Below this size (512 KiB: about a thousand open events at the table's fillfactor) a claim reads
# little whatever its plan: autovacuum's pace is enough.
MIN_PAGES = 64
# Statistics are refreshed when the table has grown past this many times the size they were taken
# at; the churn of a steady load (every claim and finish rewrites rows) is left to autovacuum.
GROWTH = 4.0


class StatisticsKeeper:
    def __init__(self, store: Store) -> None:
        self.store = store
        # The size at which this process last analyzed each table: it does not analyze a table
        # again before it has grown as much again, whatever the statistics views say (they may
        # lag, or count nothing with track_counts off).
        self._analyzed_at: dict[str, int] = {}

    def run(self) -> list[str]:
        """One look: ANALYZE each hot table whose statistics are stale; the tables analyzed."""
        analyzed = []
        for table in self.store.statistics.stale(min_pages=MIN_PAGES, growth=GROWTH):
            before = self._analyzed_at.get(table.name)
            if before is not None and table.pages_now <= GROWTH * before:
                continue
            self.store.statistics.analyze(table.name)
            self._analyzed_at[table.name] = table.pages_now
            analyzed.append(table.name)
            log.info("statistics_refreshed", table=table.name, pages=table.pages_now, pages_before=table.pages_then)
        return analyzed


def periodic(store: Store) -> Callable[[], None]:
    """The dispatcher's periodic job: one look, logging (not raising) database trouble."""
    keeper = StatisticsKeeper(store)

    def run() -> None:
        try:
            keeper.run()
        except sa.exc.DBAPIError as error:
            # The database restarting, a statement timeout...: the next look retries.
            log.warning("statistics_refresh_failed", error=str(error).splitlines()[0])

    return run
