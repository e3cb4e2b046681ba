"""Many clients at once, over real HTTP: one key, one open event, whoever wins."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import requests

from tests.conftest import auth
from tests.helpers import rows

CLIENTS = 30


def _race(live_server: str, token: str, body: dict[str, Any]) -> list[requests.Response]:
    barrier = threading.Barrier(CLIENTS)

    def one(n: int) -> requests.Response:
        with requests.Session() as session:
            barrier.wait(timeout=30)
            return session.post(
                f"{live_server}/v1/queues/emails/events",
                json={**body, "data": {"client": n}},
                headers=auth(token),
                timeout=30,
            )

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, range(CLIENTS)))


def test_thirty_clients_schedule_one_key(
    live_server: str, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    responses = _race(live_server, token, {"item_key": "race", "delay_seconds": 60})
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [202] + [409] * (CLIENTS - 1), statuses
    [winner] = [r.json() for r in responses if r.status_code == 202]
    for loser in (r for r in responses if r.status_code == 409):
        assert loser.headers["Content-Type"] == "application/problem+json"
        assert loser.json()["event"]["id"] == winner["id"]
        assert loser.json()["event"]["data"] == winner["data"]
    assert rows(raw, "tickler_event") == 1
    assert rows(raw, "tickler_timeline") == 1


def test_thirty_clients_replace_one_key(
    live_server: str, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    responses = _race(live_server, token, {"item_key": "race", "on_conflict": "replace"})
    outcomes = sorted(r.json()["outcome"] for r in responses)
    assert outcomes == ["created"] + ["replaced"] * (CLIENTS - 1), [r.text for r in responses if r.status_code >= 300]
    assert rows(raw, "tickler_event") == 1
    version = raw.execute("SELECT version FROM tickler_event_all").fetchone()
    assert version == (CLIENTS,)
    assert rows(raw, "tickler_timeline") == CLIENTS


def test_thirty_clients_ignore_one_key(live_server: str, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    responses = _race(live_server, token, {"item_key": "race", "on_conflict": "ignore"})
    assert sorted(r.status_code for r in responses) == [200] * (CLIENTS - 1) + [202]
    assert len({r.json()["id"] for r in responses}) == 1
    assert rows(raw, "tickler_event") == 1
