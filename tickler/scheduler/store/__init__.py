"""The store: the only code that talks to the database. Views, workers and the CLI call it."""

from __future__ import annotations

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.replica import ReadEngines
from tickler.scheduler.store.audit import OperationsLog
from tickler.scheduler.store.events import EventChanges, EventStore, SearchFilter
from tickler.scheduler.store.forecast import ForecastStore
from tickler.scheduler.store.history import HistoryPass, HistoryStore
from tickler.scheduler.store.leases import LeaseStore
from tickler.scheduler.store.operations import DeletedQueue, QueueGauges
from tickler.scheduler.store.queues import QueueSettings, QueueStore
from tickler.scheduler.store.schedules import Schedule, ScheduleSpec, ScheduleStore
from tickler.scheduler.store.search import Matching
from tickler.scheduler.store.statistics import StatisticsStore
from tickler.scheduler.store.tokens import TokenStore

__all__ = [
    "DeletedQueue",
    "EventChanges",
    "EventStore",
    "ForecastStore",
    "HistoryPass",
    "HistoryStore",
    "LeaseStore",
    "Matching",
    "OperationsLog",
    "QueueGauges",
    "QueueSettings",
    "QueueStore",
    "Schedule",
    "ScheduleSpec",
    "ScheduleStore",
    "SearchFilter",
    "StatisticsStore",
    "Store",
    "TokenStore",
]


# A failover to a hot standby, or `default_transaction_read_only = on`: reads work, writes fail.
_WRITABLE = "SELECT pg_is_in_recovery() AS standby, current_setting('transaction_read_only') = 'on' AS read_only"


class Store:
    """All of tickler's persistence, over one engine."""

    def __init__(self, engine: sa.Engine, reads: ReadEngines | None = None) -> None:
        self.engine = engine
        # the reads that may lag, on a replica while it is close enough (scheduler/replica.py)
        self.reads = reads or ReadEngines(engine)
        self.events = EventStore(engine, self.reads)
        self.queues = QueueStore(engine, self.reads)
        self.tokens = TokenStore(engine)
        self.leases = LeaseStore(engine)
        self.schedules = ScheduleStore(engine)
        self.history = HistoryStore(engine)
        self.statistics = StatisticsStore(engine)
        self.audit = OperationsLog(engine)
        self.forecasts = ForecastStore(engine)

    def ping(self) -> None:
        driver_rows(self.engine, "SELECT 1", prepare=False)

    def refuses_writes(self) -> str | None:
        """Why the database would refuse a write now ("standby", "read_only"), or None."""
        [row] = driver_rows(self.engine, _WRITABLE)
        return "standby" if row["standby"] else "read_only" if row["read_only"] else None

    def dispose(self) -> None:
        """Close the pools (the primary's and the replica's)."""
        self.reads.dispose()
        self.engine.dispose()
