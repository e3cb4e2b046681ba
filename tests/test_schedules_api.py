"""Recurring schedules over HTTP (SPEC §6): create, change, read, list, delete, the timeline of
the schedule's key, invalid input and tenant isolation."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, rows, written

DAILY = {"cron": "0 8 * * *", "timezone": "Europe/Berlin", "data": {"report": "daily"}}


def put(client: FlaskClient, token: str, key: str, body: dict[str, Any], queue: str = "emails") -> TestResponse:
    return client.put(f"/v1/queues/{queue}/schedules/{quote(key, safe='')}", json=body, headers=auth(token))


def schedule_events(raw: psycopg.Connection[Any], key: str) -> list[tuple[Any, ...]]:
    return raw.execute(
        "SELECT item_key, outcome, enqueued_by, data, group_key FROM tickler_event_all"
        " WHERE item_key LIKE %s ORDER BY schedule_on, id",
        [key + "@%"],
    ).fetchall()


def nothing_written(raw: psycopg.Connection[Any]) -> tuple[int, int, int]:
    return (*written(raw), rows(raw, "tickler_schedule"))


def test_put_creates_a_schedule_whose_next_occurrence_waits_as_an_event(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    response = put(client, token, "daily-report", {**DAILY, "group_key": "reports"})
    assert response.status_code == 201, response.json
    body = response.json
    assert body is not None
    assert {k: body[k] for k in ("queue", "schedule_key", "cron", "timezone", "data", "group_key")} == {
        "queue": "emails",
        "schedule_key": "daily-report",
        **DAILY,
        "group_key": "reports",
    }
    assert body["catch_up"] == "latest" and body["paused"] is False
    nexts = body["next_occurrences"]
    assert len(nexts) == 5 and all(t.endswith("Z") for t in nexts)
    assert body["last_enqueued"] == nexts[0]
    [event] = schedule_events(raw, "daily-report")
    assert event == (f"daily-report@{nexts[0]}", None, "schedule:daily-report", {"report": "daily"}, "reports")
    # the waiting occurrence is an ordinary event, readable by key
    got = client.get(key_url(f"daily-report@{nexts[0]}"), headers=auth(token))
    assert got.status_code == 200 and got.json is not None and got.json["status"] == "pending"

    again = put(client, token, "daily-report", {**DAILY, "group_key": "reports"})
    assert again.status_code == 200
    assert len(schedule_events(raw, "daily-report")) == 1  # a repeated PUT enqueues nothing more

    one = client.get("/v1/queues/emails/schedules/daily-report", headers=auth(token))
    assert one.status_code == 200 and one.json == again.json
    listed = client.get("/v1/queues/emails/schedules", headers=auth(token))
    assert listed.status_code == 200 and listed.json == {"schedules": [again.json], "next_cursor": None}


def test_list_is_paginated_by_key(client: FlaskClient, emails: str, token: str) -> None:
    for key in ("c", "a", "b"):
        assert put(client, token, key, DAILY).status_code == 201
    first = client.get("/v1/queues/emails/schedules?limit=2", headers=auth(token)).json
    assert first is not None
    assert [s["schedule_key"] for s in first["schedules"]] == ["a", "b"] and first["next_cursor"] == "b"
    second = client.get("/v1/queues/emails/schedules?limit=2&cursor=b", headers=auth(token)).json
    assert second is not None
    assert [s["schedule_key"] for s in second["schedules"]] == ["c"] and second["next_cursor"] is None


def test_a_change_moves_or_updates_the_waiting_occurrence(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    first = put(client, token, "r", DAILY).json
    assert first is not None
    # same times, new data: the waiting event keeps its key and takes the data
    changed = put(client, token, "r", {**DAILY, "data": {"report": "v2"}})
    assert changed.status_code == 200
    assert [(e[0], e[1], e[3]) for e in schedule_events(raw, "r")] == [
        (f"r@{first['next_occurrences'][0]}", None, {"report": "v2"})
    ]
    # another time: the waiting event is cancelled and the new next occurrence waits instead
    moved = put(client, token, "r", {**DAILY, "cron": "30 9 * * *", "data": {"report": "v3"}}).json
    assert moved is not None
    assert [(e[0], e[1], e[3]) for e in schedule_events(raw, "r")] == sorted(
        [
            (f"r@{first['next_occurrences'][0]}", "cancelled", {"report": "v2"}),
            (f"r@{moved['next_occurrences'][0]}", None, {"report": "v3"}),
        ],
        key=lambda e: e[0].split("@")[1],
    )


def test_paused_schedule_enqueues_nothing_and_its_waiting_occurrence_is_cancelled(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    paused = put(client, token, "p", {**DAILY, "paused": True})
    assert paused.status_code == 201 and paused.json is not None
    assert paused.json["next_occurrences"] == [] and paused.json["last_enqueued"] is None
    assert schedule_events(raw, "p") == []

    resumed = put(client, token, "p", DAILY).json
    assert resumed is not None
    assert [e[:2] for e in schedule_events(raw, "p")] == [(f"p@{resumed['next_occurrences'][0]}", None)]
    put(client, token, "p", {**DAILY, "paused": True})
    assert [e[1] for e in schedule_events(raw, "p")] == ["cancelled"]


def test_delete_stops_the_schedule_and_cancels_its_waiting_occurrence(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    created = put(client, token, "d", DAILY).json
    assert created is not None
    deleted = client.delete("/v1/queues/emails/schedules/d", headers=auth(token))
    assert deleted.status_code == 200 and deleted.json is not None and deleted.json["schedule_key"] == "d"
    assert [e[:2] for e in schedule_events(raw, "d")] == [(f"d@{created['next_occurrences'][0]}", "cancelled")]
    assert client.get("/v1/queues/emails/schedules/d", headers=auth(token)).status_code == 404
    assert client.delete("/v1/queues/emails/schedules/d", headers=auth(token)).status_code == 404
    assert rows(raw, "tickler_schedule") == 0


def test_the_schedule_key_has_a_timeline_of_its_changes(client: FlaskClient, emails: str, token: str) -> None:
    put(client, token, "t", DAILY)
    put(client, token, "t", DAILY)  # unchanged: no entry
    put(client, token, "t", {**DAILY, "catch_up": "all"})
    waiting = client.get("/v1/queues/emails/schedules/t", headers=auth(token)).json
    assert waiting is not None
    client.delete("/v1/queues/emails/schedules/t", headers=auth(token))
    response = client.get(key_url("t", suffix="/timeline"), headers=auth(token))
    assert response.status_code == 200, response.json
    body = response.json
    assert body is not None and body["item_key"] == "t"
    entries = body["entries"]
    assert [(e["action"], e["actor"], e["event_id"]) for e in entries] == [
        ("schedule_created", "signup-service", None),
        ("schedule_updated", "signup-service", None),
        ("schedule_deleted", "signup-service", None),
    ]
    assert entries[1]["details"]["changed"] == ["catch_up"]
    # when it fires next, while it does; a deleted schedule fires no more
    assert [e["schedule_on"] for e in entries] == [waiting["last_enqueued"]] * 2 + [None]
    assert entries[0]["details"]["cron"] == "0 8 * * *"
    # no event ever had the key itself
    assert client.get(key_url("t"), headers=auth(token)).status_code == 404


# (field, bad value): DAILY with that one field set so, refused with a message for that field.
BAD_FIELDS: list[tuple[str, Any]] = [
    ("colour", "blue"),
    ("cron", "0 8 * *"),
    ("cron", "0 0 8 * * *"),
    ("cron", "61 8 * * *"),
    ("cron", "0 8 * * 8"),
    ("cron", "0 0 30 2 *"),
    ("cron", 5),
    ("timezone", "Europe/Atlantis"),
    ("timezone", "../../etc/passwd"),
    ("catch_up", "sometimes"),
    ("paused", "yes"),
    ("data", [1]),
    ("group_key", "a b"),
]


@pytest.mark.parametrize(
    ("key", "body", "field"),
    [
        *[("k", {**DAILY, field: value}, field) for field, value in BAD_FIELDS],
        ("k", {k: v for k, v in DAILY.items() if k != "data"}, "data"),
        ("a@b", DAILY, "schedule_key"),
        ("x" * 235, DAILY, "schedule_key"),
        ("tab\there", DAILY, "schedule_key"),
    ],
)
def test_invalid_schedules_are_refused_and_nothing_is_written(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], key: str, body: Any, field: str
) -> None:
    before = nothing_written(raw)
    assert_problem(put(client, token, key, body), 400, field)
    assert nothing_written(raw) == before


def test_the_longest_schedule_key_still_makes_valid_occurrence_keys(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    key = "x" * 234
    assert put(client, token, key, DAILY).status_code == 201
    [event] = schedule_events(raw, key)
    assert len(event[0]) == 255


def test_another_tenants_queue_is_not_found(
    client: FlaskClient, emails: str, admin_token: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    assert client.put("/v1/queues/other", json={}, headers=auth(admin_token)).status_code == 201
    assert put(client, admin_token, "theirs", DAILY, queue="other").status_code == 201
    before = nothing_written(raw)
    assert_problem(put(client, token, "mine", DAILY, queue="other"), 404)
    for method in (client.get, client.delete):
        assert_problem(method("/v1/queues/other/schedules/theirs", headers=auth(token)), 404)
    assert_problem(client.get("/v1/queues/other/schedules", headers=auth(token)), 404)
    assert nothing_written(raw) == before
    # and the caller's own queue shows none of them
    listed = client.get("/v1/queues/emails/schedules", headers=auth(token)).json
    assert listed == {"schedules": [], "next_cursor": None}


def test_deleting_the_queue_stops_its_schedules(
    client: FlaskClient, emails: str, admin_token: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    created = put(client, token, "w", DAILY).json
    assert created is not None
    # the waiting occurrence is an open event: the queue is deleted only with cancel_open
    assert client.delete("/v1/queues/emails", headers=auth(admin_token)).status_code == 409
    deleted = client.delete("/v1/queues/emails?cancel_open=true", headers=auth(admin_token))
    assert deleted.status_code == 200, deleted.json
    assert rows(raw, "tickler_schedule") == 0
    # the schedule's history stays readable to admins
    timeline = client.get(key_url("w", suffix="/timeline"), headers=auth(admin_token))
    assert timeline.status_code == 200, timeline.json
    assert timeline.json is not None
    entries = timeline.json["entries"]
    assert [(e["action"], e["actor"]) for e in entries] == [
        ("schedule_created", "signup-service"),
        ("schedule_deleted", "ops"),
    ]
    assert entries[1]["details"]["reason"] == "queue deleted"
