"""The dispatcher's statistics job: ANALYZE the hot tables whose planner statistics are missing
or were taken when the table was a fraction of its size, and VACUUM the lease table once its dead
rows outnumber its live ones, without waiting for autovacuum (scheduler/store/statistics.py says
why claims need both)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import sqlalchemy as sa
import structlog

from tickler.scheduler.store import Store
from tickler.scheduler.store.statistics import GROWTH, MIN_DEAD_LEASES, MIN_ROWS, HotTable

log = structlog.get_logger(__name__)

# A look is one query on pg_class and the statistics views: cheap enough to make every second,
# so that a burst of events gets its statistics while the dispatchers are still draining it.
# What is stale: store/statistics.py (MIN_ROWS, GROWTH, MIN_DEAD_LEASES).
INTERVAL_SECONDS = 1.0


class StatisticsKeeper:
    def __init__(self, store: Store) -> None:
        self.store = store

    def run(self) -> list[str]:
        """One look: ANALYZE each hot table whose statistics are stale; the tables analyzed. (A
        table whose ANALYZE was skipped behind another's lock is looked at again next time.)"""
        analyzed = []
        for table in self._look():
            if not table.stale:
                continue
            self.store.statistics.analyze(table.name)
            analyzed.append(table.name)
            log.info("statistics_refreshed", table=table.name, rows=table.rows_now, rows_before=table.rows_then)
        return analyzed

    def sweep(self) -> list[str]:
        """VACUUM each swept table (the lease table) that holds more dead rows than live ones; the
        tables vacuumed."""
        vacuumed = []
        for table in self._look():
            if not table.crowded:
                continue
            self.store.statistics.vacuum(table.name)
            vacuumed.append(table.name)
            log.debug("dead_rows_vacuumed", table=table.name, rows=table.rows_now)
        return vacuumed

    def _look(self) -> list[HotTable]:
        return self.store.statistics.look(min_rows=MIN_ROWS, growth=GROWTH, min_dead=MIN_DEAD_LEASES)


def periodic(store: Store) -> Callable[[], None]:
    """The dispatcher's periodic job: one look, logging (not raising) database trouble. A look
    that starts while the previous one still runs (an ANALYZE of a large table on a busy machine
    takes longer than the interval) returns at once: the dispatcher lets two overlap (APScheduler
    would otherwise log a skipped run every second) and this lock keeps one at work."""
    keeper = StatisticsKeeper(store)
    looking = threading.Lock()

    def run() -> None:
        if not looking.acquire(blocking=False):
            return
        try:
            keeper.run()
            keeper.sweep()
        except sa.exc.DBAPIError as error:
            # The database restarting, a statement timeout...: the next look retries.
            log.warning("statistics_refresh_failed", error=str(error).splitlines()[0])
        finally:
            looking.release()

    return run
