"""Every API process caches tokens and queues (TICKLER_CACHE_SECONDS); a revoked token or a
changed queue must not outlive its NOTIFY there. Two app instances share the database, each with
its own pool and LISTEN connection, and caches that would otherwise hold for an hour."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem
from tests.helpers_wait import wait_until
from tickler.api import close_app, create_app
from tickler.api.cache import TTLCache
from tickler.config import Settings
from tickler.scheduler.store import Store


@pytest.fixture
def two_apps(settings: Settings) -> Iterator[tuple[FlaskClient, FlaskClient]]:
    apps: list[Flask] = [create_app(settings.with_overrides(cache_seconds=3600), configure_logs=False) for _ in "ab"]
    for app in apps:
        wait_until(app.extensions["tickler.listener"].connected.is_set, what="the LISTEN connection")
    yield apps[0].test_client(), apps[1].test_client()
    for app in apps:
        close_app(app)


def _refused(client: FlaskClient, token: str) -> bool:
    return client.get("/v1/queues", headers=auth(token)).status_code == 401


def test_a_token_revoked_in_one_process_is_refused_by_the_other(
    two_apps: tuple[FlaskClient, FlaskClient], store: Store, admin_token: str
) -> None:
    a, b = two_apps
    token, info = store.tokens.issue("signup-service", queues=["emails"])
    assert b.get("/v1/queues", headers=auth(token)).status_code == 200  # now cached in b
    assert a.delete(f"/v1/tokens/{info.id}", headers=auth(admin_token)).status_code == 200
    wait_until(lambda: _refused(b, token), timeout=10, what="b still accepts the revoked token")
    assert _refused(a, token)


def test_a_token_revoked_by_the_command_line_is_refused_by_the_api(
    two_apps: tuple[FlaskClient, FlaskClient], store: Store, database_url: str
) -> None:
    _, b = two_apps
    token, info = store.tokens.issue("signup-service", queues=["emails"])
    assert not _refused(b, token)
    tickler = Path(sys.executable).with_name("tickler")
    env = {**os.environ, "TICKLER_DATABASE_URL": database_url}
    subprocess.run(
        [str(tickler), "token", "revoke", str(info.id)], env=env, check=True, capture_output=True, timeout=60
    )
    wait_until(lambda: _refused(b, token), timeout=10, what="the API still accepts the revoked token")


def test_a_queue_changed_in_one_process_is_seen_by_the_other(
    two_apps: tuple[FlaskClient, FlaskClient], admin_token: str
) -> None:
    a, b = two_apps
    assert a.put("/v1/queues/emails", json={}, headers=auth(admin_token)).status_code == 201

    def max_attempts() -> int:
        body = b.get("/v1/queues/emails", headers=auth(admin_token)).json
        assert body is not None
        return int(body["max_attempts"])

    assert max_attempts() == 10  # now cached in b
    assert a.put("/v1/queues/emails", json={"max_attempts": 3}, headers=auth(admin_token)).status_code == 200
    wait_until(lambda: max_attempts() == 3, timeout=10, what="b still shows the old settings")


def test_a_queue_deleted_behind_the_cache_takes_no_events(
    two_apps: tuple[FlaskClient, FlaskClient], admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    """A process whose cache still holds a queue that is gone (deleted where no NOTIFY tells)
    answers 404 to a schedule into it, and writes nothing: the write itself finds no queue."""
    a, _ = two_apps
    assert a.put("/v1/queues/gone", json={}, headers=auth(admin_token)).status_code == 201
    assert a.get("/v1/queues/gone", headers=auth(admin_token)).status_code == 200  # cached in a
    raw.execute("DELETE FROM tickler_queue WHERE name = 'gone'")

    single = a.post("/v1/queues/gone/events", json={"item_key": "k", "data": {}}, headers=auth(admin_token))
    assert_problem(single, 404)
    batch = a.post(
        "/v1/queues/gone/events/batch", json={"events": [{"item_key": "k", "data": {}}]}, headers=auth(admin_token)
    )
    assert_problem(batch, 404)
    assert raw.execute("SELECT count(*) FROM tickler_event WHERE queue = 'gone'").fetchone() == (0,)
    assert raw.execute("SELECT count(*) FROM tickler_timeline WHERE queue = 'gone'").fetchone() == (0,)


def test_a_value_loaded_while_it_was_dropped_is_not_kept() -> None:
    cache: TTLCache[str] = TTLCache(3600)

    def load_while_revoked() -> str:
        cache.forget("k")  # another process revoked it while this one was reading the row
        return "stale"

    assert cache.get("k", load_while_revoked) == "stale"
    assert cache.get("k", lambda: "fresh") == "fresh"
    assert cache.get("k", lambda: "other") == "fresh"  # kept, since nothing was dropped meanwhile


def test_nothing_is_cached_while_drops_could_be_missed() -> None:
    cache: TTLCache[int] = TTLCache(3600)
    connected = False
    cache.trusted = lambda: connected
    loads = iter(range(10))
    assert cache.get("k", lambda: next(loads)) == 0
    assert cache.get("k", lambda: next(loads)) == 1
    connected = True
    assert cache.get("k", lambda: next(loads)) == 2
    assert cache.get("k", lambda: next(loads)) == 2


def test_close_app_stops_the_listener_and_the_pool(settings: Settings) -> None:
    """A program that builds an app and goes on running can stop what create_app started: no
    thread keeps reconnecting to a database that may be gone, no pooled connection stays open."""
    app = create_app(settings.with_overrides(cache_seconds=3600), configure_logs=False)
    listener = app.extensions["tickler.listener"]
    wait_until(listener.connected.is_set, what="the LISTEN connection")
    thread = listener._thread
    assert thread is not None and thread.is_alive()
    assert app.test_client().get("/readyz").status_code == 200  # the pool holds a connection now
    close_app(app)
    assert not thread.is_alive()
    assert app.extensions["tickler"].store.engine.pool.checkedin() == 0
