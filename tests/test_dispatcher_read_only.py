"""A failover to a standby while a delivery runs: the database refuses the ack for a while. The
dispatcher keeps the outcome and retries it once writes come back, instead of dropping it and
letting the lease expire into a second delivery. Run on a database of its own, since the
read-only setting reaches every new connection to it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from tests import pg
from tests.helpers_wait import wait_until
from tests.helpers_worker import recording_worker
from tickler.config import Settings
from tickler.scheduler.db import create_engine, libpq_url, unavailable_reason
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import Event, NewEvent
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.store.leases import LeaseStore


@pytest.fixture
def own_url(admin_url: str) -> Iterator[str]:
    url = pg.create_database(admin_url, prefix="tickler_failover")
    migrate(url)
    yield url
    pg.drop_database(admin_url, url)


def _fail_over(admin_url: str, url: str, *, read_only: bool) -> None:
    """Flip default_transaction_read_only and end every session of the database, as a failover
    to a standby (and back) does: the next connections see the new setting."""
    name = make_url(url).database
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        setting = "SET default_transaction_read_only = on" if read_only else "RESET default_transaction_read_only"
        conn.execute(sql.SQL("ALTER DATABASE {} " + setting).format(sql.Identifier(name)))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )


def test_an_ack_refused_by_a_read_only_database_is_retried_not_dropped(
    own_url: str, admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(own_url, pool_size=2)
    store = Store(engine)
    queue = store.queues.put("failover", QueueSettings(lease_seconds=10), Settings()).queue

    refusals: list[str | None] = []  # why each refused ack was refused
    original_ack = LeaseStore.ack

    def watched_ack(self: LeaseStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return original_ack(self, *args, **kwargs)
        except Exception as error:
            refusals.append(unavailable_reason(error))
            raise

    monkeypatch.setattr(LeaseStore, "ack", watched_ack)

    started, finish = threading.Event(), threading.Event()

    def work(event: Event) -> None:
        started.set()
        finish.wait(30)

    try:
        with recording_worker(own_url, "failover", work, name="failover-worker") as calls:
            store.events.schedule(queue, NewEvent(item_key="k", data={}), actor="test")
            assert started.wait(20), "the event was never delivered"
            _fail_over(admin_url, own_url, read_only=True)
            finish.set()  # the handler returns: its ack meets the read-only database
            wait_until(lambda: "read_only" in refusals, timeout=20, what=lambda: f"acks refused so far: {refusals}")
            _fail_over(admin_url, own_url, read_only=False)
            engine.dispose()  # the test's own pooled connections were ended by the failover too
            wait_until(lambda: store.events.get("failover", "k").status == "delivered", timeout=20)
    finally:  # after the worker stopped
        _fail_over(admin_url, own_url, read_only=False)
        engine.dispose()
    event = store.events.get("failover", "k")
    assert calls == [event.id], "delivered a second time: the refused ack was dropped"
    assert event.redeliver_count == 0
    engine.dispose()
