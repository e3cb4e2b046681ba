"""What every store holds: the engine, and how a single named query runs on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.sql import driver_sql


class EngineStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def rows(self, name: str, params: Mapping[str, Any] | None = None, *, tuples: bool = False) -> list[Any]:
        """The rows of the named query (as dicts; `tuples`: as tuples), run alone (autocommit) on
        a pooled connection: db.driver_rows."""
        return driver_rows(self.engine, driver_sql(name), params, tuples=tuples)
