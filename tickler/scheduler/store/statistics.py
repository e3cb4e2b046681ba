"""The planner's statistics of the hot tables (tickler_event, tickler_lease): which are missing or
were gathered when the table was a fraction of its size, and ANALYZE for them.

Every claim is planned from these statistics. A table that has never been analyzed (a new
database, the first minute after an import) has none: the planner then takes its default
selectivities (0.5 % for `lease_id IS NULL`), believes each condition of a claim leaves one row,
and may read every open event for each claim (an index of the wrong order and a sort, or a
partial index with the event ids as a filter). Measured with four workers draining 20,000 due
events of a new database: 12 to 15 ms per claim of 10 events, against 1.7 ms once analyzed
(PostgreSQL 15, 2026-11-24). Autovacuum analyzes such a table only
at its next look at the database (`autovacuum_naptime`, a minute by default, longer when its
workers are busy elsewhere); the dispatchers look every few seconds (scheduler/statistics.py).

The lease table is also read whole by every claim (its expired leases) and by every group probe:
it holds the events in flight, a few pages, but each of its rows is deleted seconds after its
insert, and until a VACUUM marks their space free the inserts go to new pages. Between two
visits of autovacuum (a minute) a drain of 3,000 events/s leaves ~2,000 pages of dead rows for
each claim to read. The dispatchers vacuum it once it holds more dead rows than live ones.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tickler.scheduler.db import driver_rows
from tickler.scheduler.store.base import EngineStore

# Below this many live rows a table's plans read little whatever they are: autovacuum's pace is enough.
MIN_ROWS = 1_000
# Statistics are refreshed when the table holds more than this many times the rows they were
# taken at; the churn of a steady load (every claim and finish rewrites rows, their number stays)
# is left to autovacuum.
GROWTH = 4.0
# The lease table is vacuumed from this many dead rows (and no fewer dead rows than live ones): a
# few pages of them. Its own autovacuum threshold is the same, but autovacuum looks once a minute.
MIN_DEAD_LEASES = 1_000
# How often a process that writes events looks (WriterLook): a query on pg_class and the
# statistics views.
WRITER_LOOK_SECONDS = 2.0

# Which tables: those that every claim reads. Fixed names, never input (they are quoted anyway).
HOT_TABLES = ("tickler_event", "tickler_lease")
# Which of them a claim reads whole (a sequential scan: its rows are few, its dead rows many).
SWEPT_TABLES = ("tickler_lease",)


@dataclass(frozen=True)
class HotTable:
    """A hot table of `rows_now` live rows (as last reported) whose statistics were taken when it
    held `rows_then` (None: never); `stale`: they are missing or old; `crowded`: a table of
    SWEPT_TABLES holding more dead rows than live ones (the query hot_tables)."""

    name: str
    rows_now: int
    rows_then: int | None
    stale: bool
    crowded: bool


class StatisticsStore(EngineStore):
    def look(self, *, min_rows: int, growth: float, min_dead: int) -> list[HotTable]:
        """The hot tables that this role may analyze and vacuum. Stale: at least `min_rows` live
        rows, never analyzed or holding more than `growth` times the rows their statistics were
        taken at. Crowded: in SWEPT_TABLES, at least `min_dead` dead rows and no fewer than live."""
        params = {
            "tables": list(HOT_TABLES),
            "swept": list(SWEPT_TABLES),
            "min_rows": min_rows,
            "growth": growth,
            "min_dead": min_dead,
        }
        return [
            HotTable(
                row["table_name"],
                int(row["rows_now"]),
                None if row["rows_then"] < 0 else int(row["rows_then"]),
                bool(row["stale"]),
                bool(row["crowded"]),
            )
            for row in self.rows("hot_tables", params)
        ]

    def stale_tables(self) -> list[HotTable]:
        """The hot tables whose statistics are missing or stale (look, with the limits above)."""
        return [t for t in self.look(min_rows=MIN_ROWS, growth=GROWTH, min_dead=MIN_DEAD_LEASES) if t.stale]

    def analyze(self, table: str) -> None:
        """ANALYZE one hot table, skipping it when another ANALYZE or VACUUM of it holds its lock
        (autovacuum, another dispatcher): that one gathers the statistics."""
        if table not in HOT_TABLES:
            raise ValueError(f"not a hot table: {table}")
        # ANALYZE takes no parameters: the name is one of HOT_TABLES, quoted.
        name = self.engine.dialect.identifier_preparer.quote(table)
        driver_rows(self.engine, f"ANALYZE (SKIP_LOCKED) {name}", prepare=False)

    def vacuum(self, table: str) -> None:
        """VACUUM one swept table (its dead rows' space is reused by the next inserts), skipping it
        when another VACUUM or ANALYZE holds its lock. Without truncating it: giving its empty
        last pages back to the file system takes an exclusive lock, which every claim would wait
        for (up to 20 ms, each time), and the next leases would only grow it again."""
        if table not in SWEPT_TABLES:
            raise ValueError(f"not a swept table: {table}")
        # VACUUM takes no parameters and no transaction: the name is one of SWEPT_TABLES, quoted.
        name = self.engine.dialect.identifier_preparer.quote(table)
        driver_rows(self.engine, f"VACUUM (SKIP_LOCKED, TRUNCATE false) {name}", prepare=False)


class WriterLook:
    """The statistics job of a process that writes events, when no dispatcher may run beside it
    (an API process, a program scheduling batches before any worker starts): after a write, at
    most once a WRITER_LOOK_SECONDS per process, ANALYZE the hot tables whose statistics are
    missing or stale. Without them the probe of a batch's keys in the open-key index
    (tickler_schedule_key_ids) was planned as a read of the queue's open events per key: 1,000
    keys over 30,000 open events of a new database took 2.3 s instead of 10 ms (PostgreSQL 15,
    2026-11-28). One look at a time per process; a failed look waits for the next."""

    def __init__(self, statistics: StatisticsStore, *, every: float = WRITER_LOOK_SECONDS) -> None:
        self.statistics = statistics
        self.every = every
        self._next = 0.0
        self._lock = threading.Lock()

    def off(self) -> None:
        """No more looks from this process (a test of the dispatchers' own job)."""
        self._next = float("inf")

    def after_write(self) -> None:
        now = time.monotonic()
        if now < self._next or not self._lock.acquire(blocking=False):
            return
        try:
            self._next = now + self.every
            for table in self.statistics.stale_tables():
                self.statistics.analyze(table.name)
        finally:
            self._lock.release()
