"""Tokens and their scopes; queues: create, update, secrets, counts that never scan events."""

from __future__ import annotations

import base64
import json
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import PROBLEM, assert_problem, key_url, put_in_flight, rows, schedule
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import Store


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer tkl_not-a-real-token"},
        {"Authorization": "tkl_not-a-real-token"},
    ],
)
def test_no_or_bad_token_is_401(client: FlaskClient, emails: str, headers: dict[str, str]) -> None:
    for method, url in (
        ("get", "/v1/queues"),
        ("get", "/v1/queues/emails"),
        ("post", "/v1/queues/emails/events"),
        ("get", "/v1/queues/nosuch/events/k"),
        ("put", "/v1/queues/new"),
    ):
        response = getattr(client, method)(url, json={"item_key": "k", "data": {}}, headers=headers)
        assert response.status_code == 401, (method, url)
        assert response.mimetype == PROBLEM
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_bad_token_writes_nothing(client: FlaskClient, emails: str, raw: psycopg.Connection[Any]) -> None:
    schedule(client, "tkl_forged", "k")
    assert rows(raw, "tickler_event") == 0


def test_token_of_one_queue_cannot_see_another(
    client: FlaskClient, emails: str, token: str, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    assert client.put("/v1/queues/billing", json={}, headers=auth(admin_token)).status_code == 201
    schedule(client, admin_token, "secret", queue="billing")
    hidden = [
        client.get("/v1/queues/billing", headers=auth(token)),
        client.get("/v1/queues/billing/events", headers=auth(token)),
        client.get("/v1/queues/billing/events/secret", headers=auth(token)),
        client.get("/v1/queues/billing/events/secret/timeline", headers=auth(token)),
        client.patch("/v1/queues/billing/events/secret", json={"data": {}}, headers=auth(token)),
        client.delete("/v1/queues/billing/events/secret", headers=auth(token)),
        schedule(client, token, "k", queue="billing"),
        client.post(
            "/v1/queues/billing/events/batch", json={"events": [{"item_key": "k", "data": {}}]}, headers=auth(token)
        ),
        client.post("/v1/queues/billing/events/cancel", json={"group_key": "g"}, headers=auth(token)),
    ]
    missing = client.get("/v1/queues/nosuch", headers=auth(token))
    for response in hidden:
        assert_problem(response, 404)
        # Indistinguishable from a queue that does not exist.
        assert response.json["title"] == missing.json["title"]
    assert rows(raw, "tickler_event") == 1
    assert client.get("/v1/queues/billing/events/secret", headers=auth(admin_token)).json["status"] == "pending"


def test_non_admin_cannot_manage_queues(client: FlaskClient, emails: str, token: str) -> None:
    assert_problem(client.put("/v1/queues/new", json={}, headers=auth(token)), 403)
    assert_problem(client.put("/v1/queues/emails", json={"max_attempts": 1}, headers=auth(token)), 403)
    assert client.get("/v1/queues/new", headers=auth(token)).status_code == 404


def test_queue_lists_are_scoped(client: FlaskClient, emails: str, token: str, admin_token: str) -> None:
    for name in ("billing", "sms"):
        client.put(f"/v1/queues/{name}", json={}, headers=auth(admin_token))
    assert [q["name"] for q in client.get("/v1/queues", headers=auth(admin_token)).json["queues"]] == [
        "billing",
        "emails",
        "sms",
    ]
    assert [q["name"] for q in client.get("/v1/queues", headers=auth(token)).json["queues"]] == ["emails"]


def test_revoked_token_is_401(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 200
    raw.execute("UPDATE tickler_token SET revoked_on = now()")
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 401


# -- queues ---------------------------------------------------------------------------------------


def test_put_creates_then_updates_keeping_omitted_fields(client: FlaskClient, admin_token: str) -> None:
    created = client.put(
        "/v1/queues/reports",
        json={"lease_seconds": 12, "max_attempts": 4, "backoff": {"initial_seconds": 2, "max_seconds": 60}},
        headers=auth(admin_token),
    )
    assert created.status_code == 201
    body = created.json
    assert body["name"] == "reports"
    assert body["delivery"] == {"mode": "pull"}
    assert body["lease_seconds"] == 12 and body["max_attempts"] == 4
    assert body["backoff"] == {"initial_seconds": 2, "max_seconds": 60, "multiplier": 2}
    assert "signing_secret" not in body
    updated = client.put("/v1/queues/reports", json={"max_attempts": 7}, headers=auth(admin_token))
    assert updated.status_code == 200
    assert updated.json["max_attempts"] == 7
    assert updated.json["lease_seconds"] == 12
    assert updated.json["backoff"] == body["backoff"]
    partial = client.put("/v1/queues/reports", json={"backoff": {"multiplier": 3}}, headers=auth(admin_token))
    assert partial.json["backoff"] == {"initial_seconds": 2, "max_seconds": 60, "multiplier": 3}
    got = client.get("/v1/queues/reports", headers=auth(admin_token)).json
    assert got["max_attempts"] == 7 and got["backoff"]["multiplier"] == 3
    # New events take the queue's max_attempts.
    assert schedule(client, admin_token, "k", queue="reports").json["max_attempts"] == 7


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"colour": 1}, "colour"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": "30"}, "lease_seconds"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"delivery": {"mode": "carrier-pigeon"}}, "delivery.mode"),
        ({"delivery": {"mode": "webhook"}}, "delivery.url"),
        ({"delivery": {"mode": "webhook", "url": "ftp://x.example"}}, "delivery.url"),
        ({"backoff": {"initial_seconds": 100, "max_seconds": 10}}, "backoff.max_seconds"),
        ({"backoff": {"multiplier": 0.5}}, "backoff.multiplier"),
        ({"rotate_signing_secret": "yes"}, "rotate_signing_secret"),
    ],
)
def test_bad_queue_settings(
    client: FlaskClient, admin_token: str, raw: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    assert_problem(client.put("/v1/queues/reports", json=body, headers=auth(admin_token)), 400, field)
    assert rows(raw, "tickler_queue") == 0


def test_bad_queue_name_is_not_a_queue(client: FlaskClient, admin_token: str, raw: psycopg.Connection[Any]) -> None:
    for name in ("Emails", "-x", "a" * 64, "a%20b"):
        assert client.put(f"/v1/queues/{name}", json={}, headers=auth(admin_token)).status_code in (400, 404)
    assert rows(raw, "tickler_queue") == 0


def _secret_bytes(secret: str) -> bytes:
    assert secret.startswith("whsec_")
    return base64.b64decode(secret.removeprefix("whsec_"), validate=True)


def test_webhook_secret_is_shown_once_and_rotates(client: FlaskClient, admin_token: str) -> None:
    webhook = {"mode": "webhook", "url": "https://receiver.example/hooks", "timeout_seconds": 5}
    created = client.put("/v1/queues/hooks", json={"delivery": webhook}, headers=auth(admin_token))
    assert created.status_code == 201
    secret = created.json["signing_secret"]
    assert len(_secret_bytes(secret)) >= 24
    assert created.json["delivery"] == webhook
    got = client.get("/v1/queues/hooks", headers=auth(admin_token))
    assert "signing_secret" not in got.json
    assert secret not in got.get_data(as_text=True)
    listed = client.get("/v1/queues", headers=auth(admin_token))
    assert secret not in listed.get_data(as_text=True)
    updated = client.put("/v1/queues/hooks", json={"max_attempts": 3}, headers=auth(admin_token))
    assert updated.status_code == 200
    assert "signing_secret" not in updated.json
    rotated = client.put("/v1/queues/hooks", json={"rotate_signing_secret": True}, headers=auth(admin_token))
    new_secret = rotated.json["signing_secret"]
    assert new_secret != secret
    _secret_bytes(new_secret)
    assert (
        client.put("/v1/queues/hooks", json={"rotate_signing_secret": False}, headers=auth(admin_token)).json.get(
            "signing_secret"
        )
        is None
    )


def test_pull_queue_turned_webhook_gets_a_secret(client: FlaskClient, admin_token: str) -> None:
    client.put("/v1/queues/q1", json={}, headers=auth(admin_token))
    changed = client.put(
        "/v1/queues/q1",
        json={"delivery": {"mode": "webhook", "url": "http://localhost:9/h"}},
        headers=auth(admin_token),
    )
    assert changed.status_code == 200
    _secret_bytes(changed.json["signing_secret"])


def test_counts_follow_transitions(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    for key in ("due1", "due2", "due3", "fly", "expired", "gone", "dead", "done"):
        schedule(client, token, key)
    for key in ("later1", "later2"):
        schedule(client, token, key, delay_seconds=3600)
    put_in_flight(raw, "fly")
    put_in_flight(raw, "expired", expired=True)
    client.delete(key_url("gone"), headers=auth(token))
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w', outcome = 'dead' WHERE item_key = 'dead'"
    )
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w', outcome = 'delivered' WHERE item_key = 'done'"
    )
    # Reuse a finished key: one more open event.
    schedule(client, token, "gone", delay_seconds=3600)
    counts = client.get("/v1/queues/emails", headers=auth(token)).json["counts"]
    assert counts == {"pending": 7, "due": 4, "in_flight": 1, "delivered": 1, "cancelled": 1, "dead": 1}
    # The same numbers as a count of the rows themselves.
    statuses = dict(
        raw.execute(
            "SELECT tickler_status(outcome, lease_expires_on, now()), count(*) FROM tickler_event_all GROUP BY 1"
        ).fetchall()
    )
    assert statuses == {"pending": 7, "in_flight": 1, "delivered": 1, "cancelled": 1, "dead": 1}
    cancelled = client.post("/v1/queues/emails/events/cancel", json={"item_key_prefix": "due"}, headers=auth(token))
    assert cancelled.json == {"cancelled": 3}
    counts = client.get("/v1/queues/emails", headers=auth(token)).json["counts"]
    assert counts == {"pending": 4, "due": 1, "in_flight": 1, "delivered": 1, "cancelled": 4, "dead": 1}


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


def test_count_queries_do_not_scan_events(store: Store, emails: str, raw: psycopg.Connection[Any]) -> None:
    raw.execute("""
        INSERT INTO tickler_event (queue, item_key, schedule_on, enqueued_by, max_attempts, dequeued_on, dequeued_by,
                                   outcome)
        SELECT 'emails', 'k' || i, now() + (i % 100) * interval '1 minute', 't', 3,
               CASE WHEN i % 3 = 0 THEN now() END, CASE WHEN i % 3 = 0 THEN 't' END,
               CASE WHEN i % 3 = 0 THEN 'delivered' END
        FROM generate_series(1, 5000) AS i
    """)
    raw.execute("ANALYZE tickler_event")
    raw.execute("ANALYZE tickler_queue_count")
    for name in ("queue_state_counts", "queue_live_counts"):
        [[plan]] = raw.execute("EXPLAIN (FORMAT JSON) " + driver_sql(name), {"queue": "emails", "now": None}).fetchall()
        plan = plan if isinstance(plan, list) else json.loads(plan)
        nodes = _plan_nodes(plan[0]["Plan"])
        scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
        assert not [s for s in scans if s[0] == "Seq Scan" and s[1] == "tickler_event"], (name, scans)
    counts = store.queues.counts("emails")
    assert counts["delivered"] == 1666
    assert counts["pending"] == 3334
