"""Pull consumers over HTTP: claims (with long-poll), ack, nack, extend, fencing, scoping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth


def schedule(client: FlaskClient, token: str, key: str, **fields: Any) -> None:
    body = {"item_key": key, "data": {"k": key}, **fields}
    assert client.post("/v1/queues/emails/events", json=body, headers=auth(token)).status_code == 202


def claim(client: FlaskClient, token: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/queues/emails/claims", json={"worker": "w1", **body}, headers=auth(token))
    assert response.status_code == 200, response.json
    result: dict[str, Any] = response.json
    return result


def test_claim_ack_and_the_timeline_names_principal_and_worker(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, "welcome:ana@example.com")
    [lease] = claim(client, token, limit=10)["leases"]
    assert lease["group_key"] is None
    [event] = lease["events"]
    assert (event["status"], event["claimed_by"]) == ("in_flight", "signup-service/w1")
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(token)).status_code == 200
    got = client.get("/v1/queues/emails/events/welcome:ana@example.com", headers=auth(token)).json
    assert (got["status"], got["dequeued_by"]) == ("delivered", "signup-service/w1")
    again = client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(token))
    assert again.status_code == 409 and again.content_type == "application/problem+json"


def test_group_is_one_lease(client: FlaskClient, emails: str, token: str) -> None:
    for i in range(3):
        schedule(client, token, f"n{i}", group_key="ana@example.com")
    schedule(client, token, "solo")
    leases = claim(client, token, limit=10)["leases"]
    sizes = sorted((lease["group_key"] or "", len(lease["events"])) for lease in leases)
    assert sizes == [("", 1), ("ana@example.com", 3)]


def test_nack_retries_then_dead(client: FlaskClient, emails: str, token: str, admin_token: str) -> None:
    client.put("/v1/queues/emails", json={"max_attempts": 2}, headers=auth(admin_token))
    schedule(client, token, "k")
    [lease] = claim(client, token)["leases"]
    response = client.post(
        f"/v1/leases/{lease['lease_id']}/nack", json={"error": "smtp down", "retry_in_seconds": 0}, headers=auth(token)
    )
    assert response.status_code == 200 and response.json["status"] == "retrying"
    [lease] = claim(client, token)["leases"]
    assert lease["events"][0]["redeliver_count"] == 1
    response = client.post(f"/v1/leases/{lease['lease_id']}/nack", json={"error": "still down"}, headers=auth(token))
    assert response.json["status"] == "dead"
    event = client.get("/v1/queues/emails/events/k", headers=auth(token)).json
    assert (event["status"], event["last_error"]) == ("dead", "still down")


def test_extend_and_validation(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, "k")
    [lease] = claim(client, token, lease_seconds=5)["leases"]
    url = f"/v1/leases/{lease['lease_id']}"
    extended = client.post(f"{url}/extend", json={"seconds": 600}, headers=auth(token))
    assert extended.status_code == 200 and extended.json["expires_at"] > lease["expires_at"]
    bad = client.post(f"{url}/extend", json={"seconds": -1}, headers=auth(token))
    assert bad.status_code == 400 and "seconds" in bad.json["errors"]
    assert client.post(f"{url}/nack", json={}, headers=auth(token)).json["errors"].keys() == {"error"}
    for body in ({}, {"worker": "w", "limit": 0}, {"worker": "w", "wait_seconds": 99}, {"worker": "w", "x": 1}):
        response = client.post("/v1/queues/emails/claims", json=body, headers=auth(token))
        assert response.status_code == 400, body
    assert client.post("/v1/leases/not-a-uuid/ack", headers=auth(token)).status_code == 409


def test_expired_and_reclaimed_lease_cannot_be_finished_by_its_old_holder(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, "k")
    [old] = claim(client, token)["leases"]
    raw.execute("UPDATE tickler_event SET lease_expires_on = now() - interval '1 second' WHERE item_key = 'k'")
    [new] = claim(client, token)["leases"]  # ends the expired lease first, then claims again
    assert new["lease_id"] != old["lease_id"]
    assert new["events"][0]["redeliver_count"] == 1
    for action in ("ack", "extend", "nack"):
        body = {"seconds": 10} if action == "extend" else {"error": "x"}
        assert client.post(f"/v1/leases/{old['lease_id']}/{action}", json=body, headers=auth(token)).status_code == 409
    assert client.post(f"/v1/leases/{new['lease_id']}/ack", headers=auth(token)).status_code == 200


def test_leases_of_other_tenants_look_unknown(client: FlaskClient, emails: str, token: str, store: Any) -> None:
    schedule(client, token, "k")
    [lease] = claim(client, token)["leases"]
    stranger = store.tokens.create("billing", queues=["invoices"])
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(stranger)).status_code == 409
    assert client.post("/v1/queues/emails/claims", json={"worker": "w"}, headers=auth(stranger)).status_code == 404


def test_long_poll_returns_as_soon_as_an_event_is_due(client: FlaskClient, emails: str, token: str, app: Any) -> None:
    schedule(client, token, "later", delay_seconds=0.5)
    result: dict[str, Any] = {}

    def poll() -> None:
        with app.test_client() as own:
            started = time.monotonic()
            result["body"] = claim(own, token, wait_seconds=15)
            result["waited"] = time.monotonic() - started

    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(timeout=20)
    [lease] = result["body"]["leases"]
    assert lease["events"][0]["item_key"] == "later"
    assert result["waited"] < 14  # woken by the due time, not by the end of the long poll


def make_due_now_by_scheduling(client: FlaskClient, token: str) -> None:
    schedule(client, token, "now")


def make_due_now_by_rescheduling(client: FlaskClient, token: str) -> None:
    moved = client.patch("/v1/queues/emails/events/now", json={"delay_seconds": 0}, headers=auth(token))
    assert moved.status_code == 200


@pytest.mark.parametrize(
    ("due_in", "make_due_now"),
    [(None, make_due_now_by_scheduling), (3600, make_due_now_by_rescheduling)],
    ids=["a new event", "a reschedule to now"],
)
def test_long_poll_is_woken_by(
    due_in: float | None,
    make_due_now: Callable[[FlaskClient, str], None],
    client: FlaskClient,
    emails: str,
    token: str,
    app: Any,
) -> None:
    if due_in is not None:
        schedule(client, token, "now", delay_seconds=due_in)  # asleep until its hour, unless woken
    result: dict[str, Any] = {}
    started = threading.Event()

    def poll() -> None:
        with app.test_client() as own:
            started.set()
            result["body"] = claim(own, token, wait_seconds=15)

    poller = threading.Thread(target=poll)
    poller.start()
    started.wait(5)
    # The poller may or may not be asleep yet; either way it must see the event long before 15 s.
    t0 = time.monotonic()
    make_due_now(client, token)
    poller.join(timeout=20)
    assert [lease["events"][0]["item_key"] for lease in result["body"]["leases"]] == ["now"]
    assert time.monotonic() - t0 < 14


def test_batch_ack_answers_per_lease_and_respects_scopes(
    client: FlaskClient, emails: str, token: str, store: Any
) -> None:
    for i in range(3):
        schedule(client, token, f"k{i}")
    leases = claim(client, token, limit=3)["leases"]
    ids = [lease["lease_id"] for lease in leases]
    stranger = store.tokens.create("billing", queues=["invoices"])
    refused = client.post("/v1/leases/ack", json={"lease_ids": ids[:1]}, headers=auth(stranger))
    assert refused.json["results"] == [{"lease_id": ids[0], "status": "stale"}]  # not its queue
    unknown = "00000000-0000-4000-8000-000000000000"
    response = client.post("/v1/leases/ack", json={"lease_ids": [*ids, unknown]}, headers=auth(token))
    assert response.status_code == 200
    assert [r["status"] for r in response.json["results"]] == ["delivered"] * 3 + ["stale"]
    assert client.get("/v1/queues/emails", headers=auth(token)).json["counts"]["delivered"] == 3
    for body in ({}, {"lease_ids": []}, {"lease_ids": ["nope"]}, {"lease_ids": [unknown] * 1001}):
        assert client.post("/v1/leases/ack", json=body, headers=auth(token)).status_code == 400, body
