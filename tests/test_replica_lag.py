"""The lag of a real streaming standby (Debian's PostgreSQL 15, tests/pg_cluster.py), as
scheduler/replica.py measures it: a caught-up standby of an idle primary is 0 s behind, and one
that lost its primary is as far behind as its last replayed transaction, however idle the
primary was: its reads go back to the primary instead of serving what it had for ever."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import pg_cluster
from tests.helpers_wait import wait_until
from tickler.scheduler.db import create_engine
from tickler.scheduler.replica import ReadEngines

pytestmark = [
    pytest.mark.replica,
    pytest.mark.skipif(not pg_cluster.available(), reason="needs Debian's PostgreSQL 15 server binaries"),
]


@pytest.fixture
def nodes() -> Iterator[tuple[pg_cluster.Node, pg_cluster.Node]]:
    """A primary and its asynchronous streaming standby, both running."""
    root = pg_cluster.make_root()
    primary = pg_cluster.Node(root, "a").init().start()
    standby: pg_cluster.Node | None = None
    try:
        standby = primary.standby(root, "b").start()
        wait_until(
            lambda: primary.execute("SELECT state FROM pg_stat_replication") == [("streaming",)],
            what="the standby streaming",
        )
        yield primary, standby
    finally:
        for node in (primary, standby):
            if node is not None:
                node.stop()
        pg_cluster.remove_root(root)


def test_a_standby_that_lost_its_primary_is_behind_not_caught_up(nodes: tuple[pg_cluster.Node, ...]) -> None:
    primary, standby = nodes
    primary.execute("CREATE TABLE t (n int)")
    primary.execute("INSERT INTO t VALUES (1)")
    [(written,)] = primary.execute("SELECT CAST(pg_current_wal_lsn() AS text)")
    wait_until(
        lambda: standby.execute(f"SELECT pg_last_wal_replay_lsn() >= '{written}'") == [(True,)],
        what="the insert replayed on the standby",
    )
    primary_engine = create_engine(primary.url(), pool_size=1, connect_timeout=2)
    standby_engine = create_engine(standby.url(), pool_size=1, connect_timeout=2)
    try:
        reads = ReadEngines(primary_engine, standby_engine, max_lag_seconds=0.5, check_seconds=0.0)
        # Caught up with an idle primary: not behind, however old its last transaction grows.
        assert reads.engine() is standby_engine and reads.lag_seconds == 0.0

        primary.stop()  # the standby keeps what it had, and nothing tells it what it misses

        def measured() -> float:
            reads.engine()
            return reads.lag_seconds if reads.lag_seconds is not None else float("nan")

        wait_until(lambda: measured() > 0.5, timeout=30, what=lambda: f"lag measured {reads.lag_seconds}")
        assert not reads.on_replica
    finally:
        primary_engine.dispose()
        standby_engine.dispose()
