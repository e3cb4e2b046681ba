"""Shared helpers of the tests: row counts, scheduling helpers, putting events in flight, the
nodes of a query plan, the end of a process that a failed test would leave running."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.conftest import auth

PROBLEM = "application/problem+json"


def rows(raw: psycopg.Connection[Any], table: str) -> int:
    """How many rows `table` holds (tickler_event, tickler_timeline, ...)."""
    found = raw.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert found is not None
    return int(found[0])


def written(raw: psycopg.Connection[Any]) -> tuple[int, int]:
    """(events, timeline entries): what a refused request must leave unchanged."""
    return rows(raw, "tickler_event"), rows(raw, "tickler_timeline")


def key_url(item_key: str, queue: str = "emails", suffix: str = "") -> str:
    """The URL of a key, percent-encoded the way a careful client spells it."""
    return f"/v1/queues/{queue}/events/{quote(item_key, safe='')}{suffix}"


def schedule(client: FlaskClient, token: str, item_key: str, queue: str = "emails", **fields: Any) -> TestResponse:
    body = {"item_key": item_key, "data": fields.pop("data", {}), **fields}
    return client.post(f"/v1/queues/{queue}/events", json=body, headers=auth(token))


def assert_problem(response: TestResponse, status: int, *fields: str) -> dict[str, Any]:
    """The response is a problem+json of `status` whose `errors` name each of `fields`."""
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == PROBLEM
    body: dict[str, Any] = response.get_json(force=True)
    assert body["status"] == status
    assert {"type", "title", "detail"} <= body.keys()
    for field in fields:
        assert field in body.get("errors", {}), body
    return body


def put_in_flight(raw: psycopg.Connection[Any], item_key: str, *, expired: bool = False, queue: str = "emails") -> None:
    """Claim the open event of `item_key` with raw SQL (there is no claim API yet)."""
    expires = "now() - interval '1 second'" if expired else "now() + interval '1 minute'"
    done = raw.execute(
        "UPDATE tickler_event SET claimed_on = now(), claimed_by = 'w', lease_id = gen_random_uuid(),"
        f" lease_expires_on = {expires} WHERE queue = %s AND item_key = %s AND dequeued_on IS NULL",
        [queue, item_key],
    )
    assert done.rowcount == 1


def plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every object of an EXPLAIN (FORMAT JSON) result, parsed, however deep, parents first: the plan
    nodes (with their "Node Type", "Relation Name", counts...) and the objects around them."""
    if isinstance(plan, dict):
        yield plan
        for value in plan.values():
            yield from plan_nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from plan_nodes(value)


def kill_if_running(process: subprocess.Popen[Any]) -> None:
    """Kill `process` and wait for it, if it still runs: a test that failed leaves nothing behind."""
    if process.poll() is None:
        process.kill()
        process.wait()
