"""What every store holds: the engine, and an autocommit view of it for single statements."""

from __future__ import annotations

import sqlalchemy as sa


class EngineStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        # Single statements run without BEGIN / COMMIT round trips.
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
