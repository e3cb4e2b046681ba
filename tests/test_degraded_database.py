"""A database that refuses writes (a failover to a standby, `default_transaction_read_only`):
writes answer 503 with Retry-After, reads keep working, /readyz says not ready, and all of it
ends when the database takes writes again. Run on a database of its own, since the setting
reaches every new connection to it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from psycopg import sql
from sqlalchemy.engine import make_url

from tests import pg
from tests.conftest import auth
from tests.helpers import PROBLEM, schedule
from tickler.api import close_app, create_app
from tickler.api.problems import Refusals
from tickler.config import Settings
from tickler.scheduler.db import libpq_url, unavailable_reason
from tickler.scheduler.migrate import migrate


@pytest.fixture
def own_app(admin_url: str) -> Iterator[Flask]:
    url = pg.create_database(admin_url, prefix="tickler_readonly")
    migrate(url)
    app = create_app(Settings(database_url=url, migrate_on_start=False, cache_seconds=0), configure_logs=False)
    yield app
    close_app(app)
    pg.drop_database(admin_url, url)


def _set_read_only(app: Flask, admin_url: str, on: bool) -> None:
    """Flip default_transaction_read_only for the app's database, and drop the app's pooled
    connections (as a failover does) so that the next ones see it."""
    url = app.extensions["tickler"].database_url
    name = sql.Identifier(make_url(url).database)
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        if on:
            conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(name))
        else:
            conn.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(name))
    app.extensions["tickler"].store.engine.dispose()


def _assert_unavailable(response: object) -> None:
    assert response.status_code == 503, response.get_data(as_text=True)  # type: ignore[attr-defined]
    assert response.mimetype == PROBLEM  # type: ignore[attr-defined]
    assert response.headers["Retry-After"] == "1"  # type: ignore[attr-defined]
    assert "read-only" in response.json["detail"]  # type: ignore[attr-defined]


def test_a_read_only_database_answers_503_to_writes_and_serves_reads(own_app: Flask, admin_url: str) -> None:
    client: FlaskClient = own_app.test_client()
    store = own_app.extensions["tickler"].store
    admin = store.tokens.create("ops", is_admin=True)
    assert client.put("/v1/queues/emails", json={}, headers=auth(admin)).status_code == 201
    assert schedule(client, admin, "a", delay_seconds=60).status_code == 202
    assert client.get("/readyz").status_code == 200

    _set_read_only(own_app, admin_url, True)
    try:
        _assert_unavailable(schedule(client, admin, "b", delay_seconds=60))
        _assert_unavailable(client.patch("/v1/queues/emails/events/a", json={"data": {"x": 1}}, headers=auth(admin)))
        _assert_unavailable(client.delete("/v1/queues/emails/events/a", headers=auth(admin)))
        _assert_unavailable(client.put("/v1/queues/emails", json={"max_attempts": 3}, headers=auth(admin)))
        _assert_unavailable(client.post("/v1/tokens", json={"name": "x"}, headers=auth(admin)))
        batch = {"events": [{"item_key": "c", "data": {}}]}
        _assert_unavailable(client.post("/v1/queues/emails/events/batch", json=batch, headers=auth(admin)))

        read = client.get("/v1/queues/emails/events/a", headers=auth(admin))
        assert read.status_code == 200 and read.json is not None and read.json["status"] == "pending"
        assert client.get("/v1/queues/emails", headers=auth(admin)).status_code == 200
        assert client.get("/v1/queues/emails/events", headers=auth(admin)).status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "read_only" in ready.json["detail"]  # type: ignore[index]
    finally:
        _set_read_only(own_app, admin_url, False)

    assert client.get("/readyz").status_code == 200
    assert schedule(client, admin, "b", delay_seconds=60).status_code == 202


def test_a_full_disk_keeps_readyz_not_ready_for_a_while() -> None:
    now = [100.0]
    refusals = Refusals(window_seconds=10, clock=lambda: now[0])
    refusals.note("read_only")  # probed directly by /readyz, not remembered
    assert refusals.recent() is None
    refusals.note("disk_full")
    now[0] += 9.5
    assert refusals.recent() == "disk_full"
    now[0] += 1
    assert refusals.recent() is None


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), "read_only"),
        (psycopg.errors.DiskFull("could not extend file"), "disk_full"),
        (psycopg.errors.AdminShutdown("terminating connection"), "shutting_down"),
        (psycopg.OperationalError("connection refused"), "unreachable"),
        (psycopg.OperationalError("FATAL:  sorry, too many clients already"), "too_many_connections"),
        (sa.exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"), "busy"),
        (psycopg.errors.UniqueViolation("duplicate key"), None),
        (psycopg.errors.DivisionByZero("division by zero"), None),
    ],
)
def test_database_errors_are_translated_once(error: Exception, reason: str | None) -> None:
    assert unavailable_reason(error) == reason


@pytest.mark.parametrize(
    "error",
    [
        sa.exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"),
        psycopg.OperationalError("too many clients"),
    ],
)
def test_a_database_that_cannot_take_the_request_now_is_a_503_with_retry_after(
    settings: Settings, error: Exception
) -> None:
    """Whatever raises it: a pool whose connections all stay busy, or a driver error that reached
    the view untranslated."""

    def busy() -> None:
        raise error

    app = create_app(settings, configure_logs=False)
    try:
        app.add_url_rule("/test-busy", view_func=busy)
        response = app.test_client().get("/test-busy")
        assert response.status_code == 503 and response.headers["Retry-After"] == "1"
        assert response.mimetype == PROBLEM
    finally:
        close_app(app)


def test_readyz_is_not_ready_after_a_disk_full_refusal(app: Flask, client: FlaskClient) -> None:
    refusals: Refusals = app.extensions["tickler.refusals"]
    assert client.get("/readyz").status_code == 200
    refusals.note("disk_full")
    try:
        response = client.get("/readyz")
        assert response.status_code == 503 and "disk_full" in response.json["detail"]  # type: ignore[index]
    finally:
        refusals._last = None
