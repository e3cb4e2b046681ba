"""A running process survives a migration that adds a column to the event rows.

psycopg prepares the statements a connection runs often, and PostgreSQL refuses a prepared
statement whose result row type changed since ("cached plan must not change result type"): after
a migration adds a column to tickler_event and tickler_event_history (as 0040 and 0045 did), every
statement returning whole event rows failed on every connection of a process that was running.
Now a statement run alone by driver_rows (the store's single named queries) runs again on a new
connection, and a statement through SQLAlchemy's connection is answered as "try again" (503 with
Retry-After in the API) once, with the pool dropped so that the next call prepares afresh."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests import pg
from tickler.config import Settings
from tickler.scheduler.db import create_engine, driver_rows, libpq_url, unavailable_reason
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import QueueSettings, Store

ADD_A_COLUMN = (
    "ALTER TABLE tickler_event ADD COLUMN added_later integer",
    "ALTER TABLE tickler_event_history ADD COLUMN added_later integer",
)


@pytest.fixture
def own_database(admin_url: str) -> Iterator[tuple[Store, psycopg.Connection[Any]]]:
    """A database of its own (its schema is changed here), and a store with one pooled connection,
    so that every statement runs on the connection that prepared the previous ones."""
    url = pg.create_database(admin_url, prefix="tickler_schema_change")
    migrate(url)
    engine = create_engine(url, pool_size=1)
    try:
        with psycopg.connect(libpq_url(url), autocommit=True) as raw:
            yield Store(engine), raw
    finally:
        engine.dispose()
        pg.drop_database(admin_url, url)


def store_backends(raw: psycopg.Connection[Any]) -> list[int]:
    """The backend pids of the store's connections (every connection of this database but `raw`)."""
    found = raw.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    return [row[0] for row in found]


def test_a_driver_statement_prepared_before_a_column_was_added_runs_again_on_its_own(
    own_database: tuple[Store, psycopg.Connection[Any]],
) -> None:
    """driver_rows (the claim, the ack, the single schedule): a statement returning whole rows,
    prepared at its first run, is refused after the column is added, and runs again on a new
    connection; the caller sees only its rows."""
    store, raw = own_database
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={"i": 1})], actor="app")
    statement = "SELECT e.* FROM tickler_event AS e WHERE e.queue = %(queue)s"
    [row] = driver_rows(store.engine, statement, {"queue": "emails"})
    assert "added_later" not in row
    [before] = store_backends(raw)

    for change in ADD_A_COLUMN:
        raw.execute(change)

    [row] = driver_rows(store.engine, statement, {"queue": "emails"})
    assert row["item_key"] == "k" and row["added_later"] is None
    assert before not in store_backends(raw)  # the connection with the stale statement was dropped
    [lease] = store.leases.claim(queue, worker="w", limit=1)  # and the store goes on
    assert store.leases.ack([lease.lease_id]) == {lease.lease_id: "emails"}


def test_any_other_statement_prepared_before_a_column_was_added_is_try_again_once(
    own_database: tuple[Store, psycopg.Connection[Any]],
) -> None:
    store, raw = own_database
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={}, delay_seconds=3600)], actor="app")
    params = {"queue": "emails", "item_key": "k", "now": None}

    def open_event() -> Any:
        # A statement returning whole event rows, run through SQLAlchemy on its own (autocommit).
        with store.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
            return conn.exec_driver_sql(driver_sql("get_open_event"), params).mappings().one()

    for _ in range(8):  # psycopg prepares a statement from its sixth run on
        assert open_event()["item_key"] == "k"

    for statement in ADD_A_COLUMN:
        raw.execute(statement)

    # This call is "try again" (the API answers 503 with Retry-After), and the pool is dropped ...
    with pytest.raises(sa.exc.DBAPIError) as refused:
        open_event()
    assert unavailable_reason(refused.value) == "schema_changed"
    assert refused.value.connection_invalidated
    # ... so that the next call prepares the statement anew.
    assert open_event()["added_later"] is None


def test_a_driver_statement_stale_on_every_pooled_connection_runs_on_a_new_one(
    own_database: tuple[Store, psycopg.Connection[Any]],
) -> None:
    """Three pooled connections prepared the statement: the first refusal drops the pool, so the
    one retry does not meet the second stale connection."""
    store, raw = own_database
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={})], actor="app")
    engine = create_engine(store.engine.url.render_as_string(hide_password=False), pool_size=3)
    statement = "SELECT e.* FROM tickler_event AS e WHERE e.queue = %(queue)s"
    try:
        held = [engine.raw_connection() for _ in range(3)]  # three connections, each preparing it
        for fairy in held:
            driver: psycopg.Connection[Any] = fairy.driver_connection  # type: ignore[assignment]
            driver.execute(statement, {"queue": "emails"}, prepare=True)
            driver.commit()
        for fairy in held:
            fairy.close()

        for change in ADD_A_COLUMN:
            raw.execute(change)

        [row] = driver_rows(engine, statement, {"queue": "emails"})
        assert row["item_key"] == "k" and "added_later" in row
    finally:
        engine.dispose()
