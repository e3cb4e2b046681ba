"""The choice of engine for the reads that may lag (scheduler/replica.py), on the tests' real
PostgreSQL: a primary counts as a replica 0 s behind, a dead port as an unreachable replica. The
lag is measured at most once a `check_seconds` of an injected clock, not per read."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest

from tests import pg_cluster
from tickler.scheduler.db import create_engine, driver_rows
from tickler.scheduler.replica import ReadEngines, ReplicaLagCollector
from tickler.scheduler.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def second_engine(database_url: str) -> Iterator[sa.Engine]:
    """Another pool on the same database, standing for a replica that is not behind."""
    engine = create_engine(database_url, pool_size=1)
    yield engine
    engine.dispose()


@pytest.fixture
def dead_engine() -> Iterator[sa.Engine]:
    engine = create_engine(f"postgresql://postgres@127.0.0.1:{pg_cluster.free_port()}/tickler", connect_timeout=2)
    yield engine
    engine.dispose()


def test_a_replica_within_the_lag_serves_the_reads_and_is_measured_once_a_second(
    engine: sa.Engine, second_engine: sa.Engine
) -> None:
    clock = Clock()
    reads = ReadEngines(engine, second_engine, max_lag_seconds=5, check_seconds=1.0, clock=clock)
    assert reads.engine() is second_engine and reads.lag_seconds == 0.0
    reads.lag_seconds = 123.0  # a mark: a new measure would overwrite it
    for _ in range(50):
        assert reads.engine() is second_engine
    assert reads.lag_seconds == 123.0  # fifty reads within the second: no measure
    clock.now += 1.0
    reads.engine()
    assert reads.lag_seconds == 0.0


def test_without_a_replica_every_read_is_the_primarys(engine: sa.Engine) -> None:
    reads = ReadEngines(engine)
    assert reads.engine() is engine and not reads.on_replica
    assert Store(engine).reads.engine() is engine
    registry = CollectorRegistry()
    registry.register(ReplicaLagCollector(reads))
    assert b"tickler_read_replica" not in generate_latest(registry)


def test_an_unreachable_replica_sends_the_reads_to_the_primary_and_shows_in_metrics(
    engine: sa.Engine, dead_engine: sa.Engine
) -> None:
    reads = ReadEngines(engine, dead_engine, max_lag_seconds=5)
    store = Store(engine, reads)
    assert reads.engine() is engine and reads.lag_seconds is None
    assert store.queues.gauges() == []  # a read that may lag, answered by the primary
    registry = CollectorRegistry()
    registry.register(ReplicaLagCollector(reads))
    metrics = {
        line.split()[0]: float(line.split()[1])
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("tickler_read_replica")
    }
    assert math.isnan(metrics["tickler_read_replica_lag_seconds"])
    assert metrics["tickler_read_replica_in_use"] == 0


def test_a_replica_that_fails_a_read_hands_it_to_the_primary(
    engine: sa.Engine, second_engine: sa.Engine, dead_engine: sa.Engine
) -> None:
    clock = Clock()
    reads = ReadEngines(engine, second_engine, clock=clock)
    assert reads.engine() is second_engine
    # the replica goes away between two measures: the read in hand is answered by the primary
    reads.replica = dead_engine
    [row] = reads.read(lambda chosen: driver_rows(chosen, "SELECT 1 AS one"))
    assert row == {"one": 1}
    assert reads.engine() is engine and reads.lag_seconds is None
