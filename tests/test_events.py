"""One key through its life: schedule, conflict policies, reschedule, change, cancel, reuse, timeline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, put_in_flight, schedule, written

KEY = "welcome:ana@example.com"


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def before(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> tuple[int, int]:
    """KEY scheduled with {"v": 1} and put in flight; what was written then (events, timeline entries)."""
    schedule(client, token, KEY, data={"v": 1})
    put_in_flight(raw, KEY)
    return written(raw)


def test_schedule_returns_202_location_and_etag(client: FlaskClient, emails: str, token: str) -> None:
    response = schedule(client, token, KEY, schedule_on="2030-01-01T10:00:00+01:00", data={"a": 1})
    assert response.status_code == 202
    body = response.json
    assert body["outcome"] == "created"
    assert body["status"] == "pending"
    assert body["schedule_on"] == "2030-01-01T09:00:00Z"  # returned in UTC
    assert body["queue"] == "emails"
    assert body["version"] == 1
    assert body["max_attempts"] == 10  # the queue's default
    assert body["enqueued_by"] == "signup-service"
    assert body["dequeued_on"] is None and body["claimed_on"] is None and body["redeliver_count"] == 0
    assert response.headers["ETag"] == '"1"'
    assert unquote(response.headers["Location"]) == f"/v1/queues/emails/events/{KEY}"
    got = client.get(response.headers["Location"], headers=auth(token))
    assert got.status_code == 200
    assert got.headers["ETag"] == '"1"'
    assert got.json["id"] == body["id"]


def test_delay_and_now_use_the_database_clock(client: FlaskClient, emails: str, token: str) -> None:
    now_event = schedule(client, token, "now").json
    assert now_event["schedule_on"] == now_event["enqueued_on"]
    later = schedule(client, token, "later", delay_seconds=90.5).json
    assert _at(later["schedule_on"]) - _at(later["enqueued_on"]) == timedelta(seconds=90.5)


def test_reject_is_409_with_the_existing_event(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    first = schedule(client, token, KEY, data={"v": 1}).json
    response = schedule(client, token, KEY, data={"v": 2})
    body = assert_problem(response, 409)
    assert body["event"]["id"] == first["id"]
    assert body["event"]["data"] == {"v": 1}
    assert written(raw) == (1, 1)


def test_ignore_returns_the_existing_event(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    first = schedule(client, token, KEY, data={"v": 1}).json
    response = schedule(client, token, KEY, data={"v": 2}, on_conflict="ignore")
    assert response.status_code == 200
    assert response.json["outcome"] == "ignored"
    assert response.json["id"] == first["id"]
    assert response.json["data"] == {"v": 1}
    assert response.json["version"] == 1
    assert written(raw) == (1, 1)


def test_ignore_on_a_free_key_creates(client: FlaskClient, emails: str, token: str) -> None:
    response = schedule(client, token, KEY, on_conflict="ignore")
    assert response.status_code == 202
    assert response.json["outcome"] == "created"


def test_replace_updates_in_place_and_bumps_version(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    first = schedule(client, token, KEY, data={"v": 1}, group_key="g1", delay_seconds=60).json
    response = schedule(
        client, token, KEY, data={"v": 2}, schedule_on="2031-05-05T05:05:05Z", max_attempts=3, on_conflict="replace"
    )
    assert response.status_code == 200
    body = response.json
    assert body["outcome"] == "replaced"
    assert body["id"] == first["id"]
    assert body["version"] == 2
    assert response.headers["ETag"] == '"2"'
    assert body["data"] == {"v": 2}
    assert body["group_key"] is None
    assert body["schedule_on"] == "2031-05-05T05:05:05Z"
    assert body["max_attempts"] == 3
    assert written(raw) == (1, 2)


def test_replace_of_an_in_flight_event_is_409(
    client: FlaskClient, token: str, raw: psycopg.Connection[Any], before: tuple[int, int]
) -> None:
    response = schedule(client, token, KEY, data={"v": 2}, on_conflict="replace")
    body = assert_problem(response, 409)
    assert body["event"]["status"] == "in_flight"
    assert written(raw) == before
    assert client.get(key_url(KEY), headers=auth(token)).json["data"] == {"v": 1}


def test_replace_after_the_lease_expired_replaces(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, KEY, data={"v": 1})
    put_in_flight(raw, KEY, expired=True)
    response = schedule(client, token, KEY, data={"v": 2}, on_conflict="replace")
    assert response.status_code == 200, response.json
    assert response.json["outcome"] == "replaced"
    assert response.json["redeliver_count"] == 1
    actions = [e["action"] for e in client.get(key_url(KEY, suffix="/timeline"), headers=auth(token)).json["entries"]]
    assert actions == ["enqueued", "lease_expired", "replaced"]


def test_full_life_of_a_key_and_its_timeline(client: FlaskClient, emails: str, token: str, store: Any) -> None:
    # Another client tries to pass itself off in the body: refused, never recorded.
    assert schedule(client, token, KEY, enqueued_by="mallory").status_code == 400

    first = schedule(client, token, KEY, delay_seconds=3600, data={"v": 1}).json
    moved = client.patch(key_url(KEY), json={"schedule_on": "2030-01-01T00:00:00Z"}, headers=auth(token))
    assert moved.status_code == 200
    assert moved.json["schedule_on"] == "2030-01-01T00:00:00Z"
    assert moved.json["version"] == 2
    changed = client.patch(key_url(KEY), json={"data": {"v": 2}, "group_key": "ana"}, headers=auth(token))
    assert changed.json["data"] == {"v": 2}
    assert changed.json["group_key"] == "ana"
    assert changed.json["schedule_on"] == "2030-01-01T00:00:00Z"  # kept
    assert changed.json["version"] == 3
    replaced = schedule(client, token, KEY, data={"v": 3}, on_conflict="replace").json
    assert replaced["version"] == 4
    cancelled = client.delete(key_url(KEY) + "?reason=unsubscribed", headers=auth(token))
    assert cancelled.status_code == 200
    assert cancelled.json["status"] == "cancelled"
    assert cancelled.json["dequeued_by"] == "signup-service"
    assert cancelled.json["dequeued_on"] is not None
    assert cancelled.headers["ETag"] == '"5"'

    # A finished event is still what GET shows, until a new one takes the key.
    assert client.get(key_url(KEY), headers=auth(token)).json["status"] == "cancelled"
    assert client.patch(key_url(KEY), json={"data": {}}, headers=auth(token)).status_code == 404
    assert client.delete(key_url(KEY), headers=auth(token)).status_code == 404

    second = schedule(client, token, KEY, data={"v": "again"})
    assert second.status_code == 202
    assert second.json["id"] != first["id"]
    got = client.get(key_url(KEY), headers=auth(token)).json
    assert got["id"] == second.json["id"]
    assert got["status"] == "pending"

    # Another token of another principal changes it: the actor is that principal.
    other = store.tokens.create("billing", queues=["emails"])
    client.delete(key_url(KEY), headers=auth(other))
    third = schedule(client, other, KEY).json
    # With two finished events, GET shows the open one; then after it finishes, the newest.
    client.delete(key_url(KEY), headers=auth(other))
    assert client.get(key_url(KEY), headers=auth(token)).json["id"] == third["id"]

    timeline = client.get(key_url(KEY, suffix="/timeline"), headers=auth(token))
    assert timeline.status_code == 200
    assert timeline.json["item_key"] == KEY
    entries = timeline.json["entries"]
    assert [(e["action"], e["actor"], e["event_id"]) for e in entries] == [
        ("enqueued", "signup-service", first["id"]),
        ("rescheduled", "signup-service", first["id"]),
        ("updated", "signup-service", first["id"]),
        ("replaced", "signup-service", first["id"]),
        ("cancelled", "signup-service", first["id"]),
        ("enqueued", "signup-service", second.json["id"]),
        ("cancelled", "billing", second.json["id"]),
        ("enqueued", "billing", third["id"]),
        ("cancelled", "billing", third["id"]),
    ]
    assert entries[1]["schedule_on"] == "2030-01-01T00:00:00Z"
    assert entries[1]["details"]["previous_schedule_on"] == first["schedule_on"]
    assert entries[4]["details"] == {"reason": "unsubscribed"}
    stamps = [_at(e["at"]) for e in entries]
    assert stamps == sorted(stamps)
    assert all(stamp.tzinfo is not None and stamp.utcoffset() == timedelta(0) for stamp in stamps)


def test_patch_with_delay_reschedules_from_now(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, KEY, schedule_on="2030-01-01T00:00:00Z")
    before = datetime.now(UTC)
    moved = client.patch(key_url(KEY), json={"delay_seconds": 120}, headers=auth(token)).json
    due = _at(moved["schedule_on"])
    assert before + timedelta(seconds=100) < due < datetime.now(UTC) + timedelta(seconds=140)


def test_patch_that_changes_nothing_keeps_the_version(client: FlaskClient, emails: str, token: str) -> None:
    created = schedule(client, token, KEY, data={"v": 1}).json
    same = client.patch(key_url(KEY), json={"data": {"v": 1}}, headers=auth(token))
    assert same.status_code == 200
    assert same.json["version"] == created["version"]


def test_patch_can_remove_the_group(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, KEY, group_key="g")
    assert client.patch(key_url(KEY), json={"group_key": None}, headers=auth(token)).json["group_key"] is None


def test_never_seen_key_is_404(client: FlaskClient, emails: str, token: str) -> None:
    for response in (
        client.get(key_url("nope"), headers=auth(token)),
        client.get(key_url("nope", suffix="/timeline"), headers=auth(token)),
        client.patch(key_url("nope"), json={"data": {}}, headers=auth(token)),
        client.delete(key_url("nope"), headers=auth(token)),
    ):
        assert_problem(response, 404)


def test_keys_are_per_queue(client: FlaskClient, emails: str, admin_token: str) -> None:
    assert client.put("/v1/queues/sms", json={}, headers=auth(admin_token)).status_code == 201
    assert schedule(client, admin_token, KEY, queue="emails").status_code == 202
    assert schedule(client, admin_token, KEY, queue="sms").status_code == 202
    assert (
        client.get(key_url(KEY, queue="sms", suffix="/timeline"), headers=auth(admin_token)).json["entries"][0]["actor"]
        == "ops"
    )


# -- If-Match -----------------------------------------------------------------------------------


def test_patch_with_stale_etag_is_412_and_changes_nothing(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, KEY, data={"v": 1})
    client.patch(key_url(KEY), json={"data": {"v": 2}}, headers=auth(token))
    before = written(raw)
    stale = client.patch(key_url(KEY), json={"data": {"v": 3}}, headers={**auth(token), "If-Match": '"1"'})
    assert_problem(stale, 412)
    assert written(raw) == before
    assert client.get(key_url(KEY), headers=auth(token)).json["data"] == {"v": 2}
    fresh = client.patch(key_url(KEY), json={"data": {"v": 3}}, headers={**auth(token), "If-Match": '"2"'})
    assert fresh.status_code == 200
    assert fresh.headers["ETag"] == '"3"'
    several = client.patch(key_url(KEY), json={"data": {"v": 4}}, headers={**auth(token), "If-Match": '"1", "3"'})
    assert several.status_code == 200
    star = client.patch(key_url(KEY), json={"data": {"v": 5}}, headers={**auth(token), "If-Match": "*"})
    assert star.status_code == 200
    assert star.json["version"] == 5
    for junk in ('"abc"', '""', ",", "", 'W/"5"'):
        refused = client.patch(key_url(KEY), json={"data": {"v": 6}}, headers={**auth(token), "If-Match": junk})
        assert_problem(refused, 412)


def test_delete_with_stale_etag_is_412_and_changes_nothing(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, KEY)
    client.patch(key_url(KEY), json={"data": {"v": 2}}, headers=auth(token))
    before = written(raw)
    assert_problem(client.delete(key_url(KEY), headers={**auth(token), "If-Match": '"1"'}), 412)
    assert written(raw) == before
    assert client.get(key_url(KEY), headers=auth(token)).json["status"] == "pending"
    assert client.delete(key_url(KEY), headers={**auth(token), "If-Match": '"2"'}).status_code == 200


def test_delete_with_star_etag(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, KEY)
    response = client.delete(key_url(KEY), headers={**auth(token), "If-Match": "*"})
    assert response.status_code == 200
    assert response.json["status"] == "cancelled"


def test_weak_etag_does_not_match(client: FlaskClient, emails: str, token: str) -> None:
    # If-Match uses the strong comparison (RFC 9110 13.1.1): W/"1" matches nothing.
    schedule(client, token, KEY)
    assert_problem(client.delete(key_url(KEY), headers={**auth(token), "If-Match": 'W/"1"'}), 412)


# -- in flight ----------------------------------------------------------------------------------


def test_patch_and_delete_of_an_in_flight_event_are_409(
    client: FlaskClient, token: str, raw: psycopg.Connection[Any], before: tuple[int, int]
) -> None:
    got = client.get(key_url(KEY), headers=auth(token)).json
    assert got["status"] == "in_flight"
    assert got["claimed_by"] == "w"
    assert_problem(client.patch(key_url(KEY), json={"data": {"v": 2}}, headers=auth(token)), 409)
    assert_problem(client.delete(key_url(KEY), headers=auth(token)), 409)
    assert_problem(client.delete(key_url(KEY), headers={**auth(token), "If-Match": "*"}), 409)
    assert written(raw) == before
    assert client.get(key_url(KEY), headers=auth(token)).json["version"] == 1


def test_patch_after_the_lease_expired_works_and_logs_the_expiry(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, KEY, data={"v": 1})
    put_in_flight(raw, KEY, expired=True)
    assert client.get(key_url(KEY), headers=auth(token)).json["status"] == "pending"
    response = client.patch(key_url(KEY), json={"data": {"v": 2}}, headers=auth(token))
    assert response.status_code == 200, response.json
    assert response.json["redeliver_count"] == 1
    assert response.json["status"] == "pending"
    assert response.json["data"] == {"v": 2}
    entries = client.get(key_url(KEY, suffix="/timeline"), headers=auth(token)).json["entries"]
    assert [e["action"] for e in entries] == ["enqueued", "lease_expired", "updated"]
    assert entries[1]["actor"] == "tickler"
    assert entries[1]["details"]["claimed_by"] == "w"


def test_delete_after_the_lease_expired_works(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, KEY)
    put_in_flight(raw, KEY, expired=True)
    response = client.delete(key_url(KEY), headers=auth(token))
    assert response.status_code == 200
    assert response.json["status"] == "cancelled"
    assert response.json["redeliver_count"] == 1
    actions = [e["action"] for e in client.get(key_url(KEY, suffix="/timeline"), headers=auth(token)).json["entries"]]
    assert actions == ["enqueued", "lease_expired", "cancelled"]


def test_if_match_after_the_lease_expired_uses_the_current_version(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, KEY)
    put_in_flight(raw, KEY, expired=True)
    # The client saw version 1; ending the lease changed the event, so version 1 is stale.
    assert_problem(client.delete(key_url(KEY), headers={**auth(token), "If-Match": '"1"'}), 412)
