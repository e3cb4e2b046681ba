"""History by day (SPEC §9): the maintenance pass that keeps the day partitions of finished
events and of the timeline (migrations/0021_history_by_day.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from psycopg import errors

from tickler.scheduler.db import driver_connection
from tickler.scheduler.sql import driver_sql, run
from tickler.scheduler.store.base import EngineStore

# Days of partitions created ahead of today: writes land in their day's partition, not the default.
DAYS_AHEAD = 3
# A pass gives up on a lock it cannot have within 0.5 s (not to hold up writers): tries this often.
ATTEMPTS = 5


@dataclass(frozen=True)
class HistoryPass:
    """What one maintenance pass did: the partitions it created and those it dropped."""

    created: tuple[str, ...]
    dropped: tuple[str, ...]


class HistoryStore(EngineStore):
    def maintain(self, now: datetime | None = None, days_ahead: int = DAYS_AHEAD, *, wait: bool = True) -> HistoryPass:
        """Give rows in the default partitions their day, create the next days' partitions (and
        their parts by retention class), and drop the parts of days past their queues' retention
        (tickler_maintain_history). Any number of processes may call it; one at a time does the
        work. `wait`: while another process is at it, wait for it and then make this pass (the
        pass asked for, with its clock); otherwise return at once, having done nothing (the
        dispatchers' periodic job: the other pass does the same work)."""
        params = {"now": now, "days_ahead": days_ahead}
        statement = driver_sql("maintain_history")
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with driver_connection(self.engine, statement, params) as conn:
                    if wait:  # the pass's own try-lock then finds it held by this transaction
                        run(conn, driver_sql("wait_for_history_pass"))
                    [row] = run(conn, statement, params)
                return HistoryPass(tuple(row["created"] or ()), tuple(row["dropped"] or ()))
            except sa.exc.OperationalError as error:
                if not isinstance(error.orig, errors.LockNotAvailable) or attempt == ATTEMPTS:
                    raise
        raise AssertionError("unreachable")
