"""The dispatcher's upkeep of the operations log and of the upcoming-load counters: entries past
TICKLER_AUDIT_RETENTION_DAYS go, and the counters' per-backend slots are folded together (so a
forecast reads about one row per minute). Every dispatcher runs it; the work is idempotent."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
import structlog

from tickler.scheduler.store import Store

log = structlog.get_logger(__name__)

INTERVAL_SECONDS = 600.0


def periodic(store: Store, retention_days: int) -> Callable[[], None]:
    """One pass: prune the log, fold the counters; database trouble is logged, the next pass retries."""

    def run() -> None:
        try:
            pruned = store.audit.prune(retention_days)
            store.forecasts.fold()
        except sa.exc.DBAPIError as error:
            log.warning("operations_upkeep_failed", error=str(error).splitlines()[0])
            return
        if pruned:
            log.info("operations_log_pruned", entries=pruned, retention_days=retention_days)

    return run
