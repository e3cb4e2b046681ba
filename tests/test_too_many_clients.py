"""A PostgreSQL that refuses connections ("sorry, too many clients already"): every refusal is a
503 problem+json with Retry-After, never a 500, on every path that schedules (a
single event with group commit, small batches, COPY batches) and in the store's driver calls
(the claim and the ack too); and nothing of a refused request is written.

Runs on a PostgreSQL server of its own with `max_connections = 20`, whose free slots the test
takes itself (plain connections, held open) so that the app meets the limit for certain."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask

from tests import pg
from tests.conftest import empty_tables
from tests.helpers import PROBLEM
from tests.helpers_http import serving_app
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.db import create_engine, libpq_url, unavailable_reason
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import QueueSettings, Store

MAX_CONNECTIONS = 20
CLIENTS = 40
REQUESTS_PER_CLIENT = 12
DEADLINE_SECONDS = 120.0


@pytest.fixture(scope="module")
def small_server() -> Iterator[str]:
    """A throwaway embedded PostgreSQL with max_connections = 20; yields a migrated database's URL."""
    directory = Path(tempfile.mkdtemp(prefix="tickler-test-pg-small-"))
    server = pg.embedded_server(directory / "data")
    from pgserver._commands import pg_ctl

    try:
        admin = str(server.get_uri())
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)
        with psycopg.connect(admin, autocommit=True) as conn:
            assert conn.execute("SHOW max_connections").fetchone() == (str(MAX_CONNECTIONS),)
        url = pg.create_database(admin, prefix="tickler_crowded")
        migrate(url)
        yield url
    finally:
        # pgserver stops only the postmaster it started, which the restart above replaced: the
        # one running now is stopped here, or it would outlive its deleted data directory.
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user, timeout=60)
        server.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


class Crowd:
    """Plain connections that hold the server's free slots."""

    def __init__(self, url: str) -> None:
        self.url = libpq_url(url)
        self.held: list[psycopg.Connection[Any]] = []

    def take_all_but(self, free: int) -> None:
        """Open connections until the server refuses one, then close `free` of them."""
        while True:
            try:
                self.held.append(psycopg.connect(self.url, autocommit=True))
            except psycopg.OperationalError as error:
                assert "too many clients" in str(error), error
                break
            assert len(self.held) <= MAX_CONNECTIONS, "the server takes more connections than max_connections"
        for _ in range(min(free, len(self.held))):
            self.held.pop().close()

    def leave(self) -> None:
        while self.held:
            self.held.pop().close()


@pytest.fixture
def crowd(small_server: str) -> Iterator[Crowd]:
    crowd = Crowd(small_server)
    yield crowd
    crowd.leave()


@pytest.fixture
def crowded_app(small_server: str) -> Iterator[Flask]:
    with psycopg.connect(libpq_url(small_server), autocommit=True) as conn:
        empty_tables(conn)
    app = create_app(Settings(database_url=small_server, migrate_on_start=False, cache_seconds=0), configure_logs=False)
    yield app
    close_app(app)


@dataclass
class Answers:
    """What the clients were answered: status counts, the refusals that broke the contract, and
    the keys each answer says were written."""

    statuses: dict[int, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, status: int, headers: Any, body: bytes, keys: list[str]) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if 200 <= status < 300:
                parsed = json.loads(body)
                if "results" in parsed:  # a batch: the items written
                    self.written.update(r["item_key"] for r in parsed["results"] if r["outcome"] == "created")
                else:
                    self.written.update(keys)
                return
            content_type = headers.get("Content-Type", "")
            if status != 503 or not content_type.startswith(PROBLEM) or not headers.get("Retry-After"):
                self.wrong.append(f"{status} {content_type} Retry-After={headers.get('Retry-After')!r}: {body[:300]!r}")


def _post(base: str, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def _client(base: str, token: str, number: int, start: threading.Barrier, answers: Answers) -> None:
    start.wait(timeout=DEADLINE_SECONDS)
    for n in range(REQUESTS_PER_CLIENT):
        prefix = f"c{number}-r{n}"
        if n % 4 == 3:  # a small batch: one statement on the driver
            keys = [f"{prefix}-{i}" for i in range(3)]
        elif n % 6 == 5:  # a larger batch
            keys = [f"{prefix}-{i}" for i in range(200)]
        else:  # a single event: group commit
            keys = [prefix]
        if len(keys) == 1:
            body: dict[str, Any] = {"item_key": keys[0], "data": {"n": n}, "delay_seconds": 60}
            status, headers, text = _post(base, "/v1/queues/crowded/events", token, body)
        else:
            body = {"events": [{"item_key": key, "data": {}, "delay_seconds": 60} for key in keys]}
            status, headers, text = _post(base, "/v1/queues/crowded/events/batch", token, body)
        answers.note(status, headers, text, keys)


def test_a_database_out_of_connections_answers_503_never_500(
    crowded_app: Flask, crowd: Crowd, small_server: str
) -> None:
    store: Store = crowded_app.extensions["tickler"].store
    token = store.tokens.create("crowd", is_admin=True)
    store.queues.put("crowded", QueueSettings(), Settings())

    answers = Answers()
    with serving_app(crowded_app) as base:
        status, _, text = _post(base, "/v1/queues/crowded/events", token, {"item_key": "warm", "data": {}})
        assert status == 202, text
        crowd.take_all_but(4)  # the app may open a few connections, then meets the limit
        start = threading.Barrier(CLIENTS)
        threads = [
            threading.Thread(target=_client, args=(base, token, number, start, answers), daemon=True)
            for number in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=DEADLINE_SECONDS)
            assert not thread.is_alive(), f"a client was still waiting after {DEADLINE_SECONDS} s"
        crowd.leave()
        # The limit gone, the same app schedules again.
        status, _, text = _post(base, "/v1/queues/crowded/events", token, {"item_key": "after", "data": {}})
        assert status == 202, text

    assert answers.wrong == [], f"{len(answers.wrong)} refusals broke the contract: {answers.wrong[:5]}"
    assert answers.statuses.get(500, 0) == 0
    assert answers.statuses.get(503, 0) > 0, answers.statuses  # the limit was met
    assert sum(answers.statuses.values()) == CLIENTS * REQUESTS_PER_CLIENT
    # Nothing of a refused request was written: the events are exactly those answered as written.
    with psycopg.connect(libpq_url(small_server), autocommit=True) as conn:
        stored = {row[0] for row in conn.execute("SELECT item_key FROM tickler_event WHERE queue = 'crowded'")}
    assert stored - {"warm", "after"} == answers.written


def test_every_driver_call_of_the_store_translates_a_refused_connection(small_server: str, crowd: Crowd) -> None:
    engine = create_engine(small_server, pool_size=2)
    try:
        store = Store(engine)
        queue = store.queues.put("refused", QueueSettings(), Settings()).queue
        engine.dispose()  # no idle connection left: every call below must open one
        crowd.take_all_but(0)
        now = datetime.now(UTC)
        one = [NewEvent(item_key="a", data={}, schedule_on=now)]
        many = [NewEvent(item_key=f"b{i}", data={}, schedule_on=now) for i in range(3)]
        calls = {
            "schedule": lambda: store.events.schedule(queue, one[0], actor="t"),
            "schedule_batch": lambda: store.events.schedule_batch(queue, many, actor="t"),
            "claim": lambda: store.leases.claim(queue, worker="w", limit=5),
            "ack": lambda: store.leases.ack(["00000000-0000-0000-0000-000000000000"]),
        }
        for name, call in calls.items():
            with pytest.raises(sa.exc.DBAPIError) as raised:
                call()
            assert unavailable_reason(raised.value) == "too_many_connections", name
    finally:
        crowd.leave()
        engine.dispose()
