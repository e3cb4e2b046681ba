"""Where the reads that may lag go: a replica (TICKLER_READ_DATABASE_URL) while it is close enough
to the primary, else the primary.

Search, timelines, the dashboard's lists and charts, queue counts and gauges read through a
ReadEngines (the stores' `reads`); claims, leases and every write use the primary's engine,
always. The replica's lag is measured at most once a `check_seconds`, by whichever reader comes
first when the last measure is that old (the others go on with the last decision, without
waiting); a replica that cannot be reached, or that is further behind than `max_lag_seconds`,
sends the reads to the primary until a later measure says otherwise.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import sqlalchemy as sa
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tickler.config import Settings
from tickler.scheduler.connect import REPLICA_CONNECT_TIMEOUT
from tickler.scheduler.db import create_engine, driver_rows, unavailable_reason
from tickler.scheduler.sql import driver_sql

log = structlog.get_logger(__name__)

T = TypeVar("T")


class ReadEngines:
    """The engine for reads that may lag (`engine()`), and `read(f)` that runs `f(engine)` there,
    on the primary again if the replica fails it as unavailable."""

    def __init__(
        self,
        primary: sa.Engine,
        replica: sa.Engine | None = None,
        *,
        max_lag_seconds: float = 5.0,
        check_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.max_lag_seconds = max_lag_seconds
        self.check_seconds = check_seconds
        self._clock = clock
        self._checking = threading.Lock()
        self._checked_at = -math.inf
        self._use_replica = False
        # the last measure: seconds behind, or None when the replica could not be asked
        self.lag_seconds: float | None = None

    def engine(self) -> sa.Engine:
        """The replica's engine while it is within the lag allowed, else the primary's."""
        if self.replica is None:
            return self.primary
        if self._clock() - self._checked_at >= self.check_seconds and self._checking.acquire(blocking=False):
            try:
                self._check(self.replica)
            finally:
                self._checking.release()
        return self.replica if self._use_replica else self.primary

    def read(self, run: Callable[[sa.Engine], T]) -> T:
        """run(engine()), and on the primary when the replica turns out to be unavailable (it
        failed since the last measure): a read that may lag never fails for the replica alone."""
        engine = self.engine()
        if engine is self.primary:
            return run(engine)
        try:
            return run(engine)
        except sa.exc.DBAPIError as error:
            if unavailable_reason(error) is None:
                raise
            self._set(None, self._clock())
            log.warning("read_replica_unavailable", reason=unavailable_reason(error))
            return run(self.primary)

    def _check(self, replica: sa.Engine) -> None:
        lag: float | None
        try:
            [row] = driver_rows(replica, driver_sql("replica_lag"))
            lag = math.inf if row["lag_seconds"] is None else max(0.0, float(row["lag_seconds"]))
        except sa.exc.DBAPIError as error:
            if unavailable_reason(error) is None:
                raise
            lag = None
        self._set(lag, self._clock())

    def _set(self, lag: float | None, at: float) -> None:
        use = lag is not None and lag <= self.max_lag_seconds
        if use != self._use_replica:
            log.info(
                "reads_moved", to="replica" if use else "primary", lag_seconds=lag, max_lag_seconds=self.max_lag_seconds
            )
        self.lag_seconds, self._use_replica, self._checked_at = lag, use, at

    @property
    def on_replica(self) -> bool:
        return self.replica is not None and self._use_replica

    def dispose(self) -> None:
        if self.replica is not None:
            self.replica.dispose()


def read_engines(primary: sa.Engine, settings: Settings, *, pool_size: int | None = None) -> ReadEngines:
    """The reads of a process: on the replica of TICKLER_READ_DATABASE_URL (an engine of its own,
    `pool_size` connections, the settings' by default), or all on the primary when there is none."""
    replica = None
    if settings.read_database_url:
        timeout = REPLICA_CONNECT_TIMEOUT
        if settings.connect_timeout:  # 0: wait for ever, which a replica is not worth
            timeout = min(timeout, settings.connect_timeout)
        replica = create_engine(
            settings.read_database_url, pool_size=pool_size or settings.pool_size, connect_timeout=timeout
        )
    return ReadEngines(primary, replica, max_lag_seconds=settings.read_max_lag_seconds)


class ReplicaLagCollector(Collector):
    """/metrics: the read replica's lag and whether the reads that may lag go to it."""

    def __init__(self, reads: ReadEngines) -> None:
        self.reads = reads

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.reads.replica is None:
            return
        self.reads.engine()  # measure again if the last measure is old
        lag = GaugeMetricFamily(
            "tickler_read_replica_lag_seconds",
            "Seconds the read replica is behind the primary (NaN: it cannot be reached).",
        )
        lag.add_metric([], math.nan if self.reads.lag_seconds is None else self.reads.lag_seconds)
        yield lag
        used = GaugeMetricFamily(
            "tickler_read_replica_in_use",
            "1 while the reads that may lag go to the replica; 0 while they go to the primary.",
        )
        used.add_metric([], 1 if self.reads.on_replica else 0)
        yield used
