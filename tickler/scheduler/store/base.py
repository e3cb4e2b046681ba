"""What every store holds: the engine, and how a single named query runs on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.replica import ReadEngines
from tickler.scheduler.sql import driver_sql, file_queries


def sql_file(filename: str) -> Callable[[str], str]:
    """The named queries of a SQL file beside the store's modules, in psycopg's placeholders, for
    sql.run: `_sql = sql_file("audit.sql")`, then `_sql("name")` (the file is read on first use)."""
    return lambda name: file_queries("tickler.scheduler.store", filename)[name]


class EngineStore:
    def __init__(self, engine: sa.Engine, reads: ReadEngines | None = None) -> None:
        self.engine = engine
        # the reads that may lag (search, timelines, counts, the dashboard's lists): a replica's
        # engine while it is close enough; claims, leases and writes use self.engine, always
        self.reads = reads or ReadEngines(engine)

    def rows(self, name: str, params: Mapping[str, Any] | None = None, *, tuples: bool = False) -> list[Any]:
        """The rows of the named query (as dicts; `tuples`: as tuples), run alone (autocommit) on
        a pooled connection: db.driver_rows."""
        return driver_rows(self.engine, driver_sql(name), params, tuples=tuples)

    def lagging_rows(self, name: str, params: Mapping[str, Any] | None = None, *, tuples: bool = False) -> list[Any]:
        """rows(), on the engine of the reads that may lag (a replica: ReadEngines.read)."""
        return self.reads.read(lambda engine: driver_rows(engine, driver_sql(name), params, tuples=tuples))
