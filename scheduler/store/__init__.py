"""The store: the only code that talks to the database. Views, workers and the CLI call it."""

from __future__ import annotations

import sqlalchemy as sa

from scheduler.store.events import EventChanges, EventStore, SearchFilter
from scheduler.store.leases import LeaseStore
from scheduler.store.queues import QueueSettings, QueueStore
from scheduler.store.tokens import TokenStore

__all__ = [
    "EventChanges",
    "EventStore",
    "LeaseStore",
    "QueueSettings",
    "QueueStore",
    "SearchFilter",
    "Store",
    "TokenStore",
]


class Store:
    """All of tickler's persistence, over one engine."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.events = EventStore(engine)
        self.queues = QueueStore(engine)
        self.tokens = TokenStore(engine)
        self.leases = LeaseStore(engine)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
