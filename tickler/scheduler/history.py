"""The dispatcher's history job (SPEC §9): keep the day partitions of finished events and of the
timeline, and drop whole days past retention (see HistoryStore.maintain)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
import structlog

from tickler.scheduler.store import Store

log = structlog.get_logger(__name__)

# Partitions are made days ahead, so this only has to run now and then; dropping a day waits for
# its day to be past retention anyway. Every dispatcher runs it; one at a time does the work.
INTERVAL_SECONDS = 600.0


def periodic(store: Store) -> Callable[[], None]:
    """The dispatcher's periodic job: one maintenance pass, logging (not raising) database trouble."""

    def run() -> None:
        try:
            done = store.history.maintain(wait=False)  # another process's pass does the same
        except sa.exc.DBAPIError as error:
            # A lock timeout behind a long transaction, the database restarting...: the next run retries.
            log.warning("history_maintenance_failed", error=str(error).splitlines()[0])
            return
        if done.created or done.dropped:
            log.info("history_maintained", created=list(done.created), dropped=list(done.dropped))

    return run
