"""Bad requests: 400 (or 413) problem+json naming the field, and nothing written."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import PROBLEM, assert_problem, key_url, schedule, written
from tickler.api import close_app, create_app
from tickler.config import Settings

GOOD: dict[str, Any] = {"item_key": "welcome:ana@example.com", "data": {"name": "Ana"}}

BAD_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown field", {**GOOD, "colour": "red"}, "colour"),
    ("enqueued_by is not the client's to say", {**GOOD, "enqueued_by": "mallory"}, "enqueued_by"),
    ("missing item_key", {"data": {}}, "item_key"),
    ("missing data", {"item_key": "k"}, "item_key" if False else "data"),
    ("item_key with /", {**GOOD, "item_key": "a/b"}, "item_key"),
    ("item_key with a space", {**GOOD, "item_key": "a b"}, "item_key"),
    ("item_key with a tab", {**GOOD, "item_key": "a\tb"}, "item_key"),
    ("item_key with a newline", {**GOOD, "item_key": "a\nb"}, "item_key"),
    ("item_key with NUL", {**GOOD, "item_key": "a\u0000b"}, "item_key"),
    ("item_key with DEL", {**GOOD, "item_key": "a\u007fb"}, "item_key"),
    ("item_key with a no-break space", {**GOOD, "item_key": "a\u00a0b"}, "item_key"),
    ("item_key of 256 characters", {**GOOD, "item_key": "k" * 256}, "item_key"),
    ("empty item_key", {**GOOD, "item_key": ""}, "item_key"),
    ("item_key not a string", {**GOOD, "item_key": 42}, "item_key"),
    ("item_key null", {**GOOD, "item_key": None}, "item_key"),
    ("group_key with a space", {**GOOD, "group_key": "a b"}, "group_key"),
    ("schedule_on without offset", {**GOOD, "schedule_on": "2030-01-01T09:00:00"}, "schedule_on"),
    ("schedule_on with a space", {**GOOD, "schedule_on": "2030-01-01 09:00:00Z"}, "schedule_on"),
    ("schedule_on a date only", {**GOOD, "schedule_on": "2030-01-01"}, "schedule_on"),
    ("schedule_on not a string", {**GOOD, "schedule_on": 1893488400}, "schedule_on"),
    ("schedule_on impossible day", {**GOOD, "schedule_on": "2030-02-30T09:00:00Z"}, "schedule_on"),
    ("schedule_on far ahead", {**GOOD, "schedule_on": "9999-01-01T00:00:00Z"}, "schedule_on"),
    ("schedule_on and delay", {**GOOD, "schedule_on": "2030-01-01T09:00:00Z", "delay_seconds": 5}, "delay_seconds"),
    ("negative delay", {**GOOD, "delay_seconds": -1}, "delay_seconds"),
    ("delay a boolean", {**GOOD, "delay_seconds": True}, "delay_seconds"),
    ("delay a string", {**GOOD, "delay_seconds": "60"}, "delay_seconds"),
    ("delay null", {**GOOD, "delay_seconds": None}, "delay_seconds"),
    ("max_attempts 0", {**GOOD, "max_attempts": 0}, "max_attempts"),
    ("max_attempts 1.5", {**GOOD, "max_attempts": 1.5}, "max_attempts"),
    ("max_attempts a boolean", {**GOOD, "max_attempts": True}, "max_attempts"),
    ("max_attempts a string", {**GOOD, "max_attempts": "3"}, "max_attempts"),
    ("on_conflict unknown", {**GOOD, "on_conflict": "overwrite"}, "on_conflict"),
    ("on_conflict not a string", {**GOOD, "on_conflict": 1}, "on_conflict"),
    ("data a list", {**GOOD, "data": [1, 2]}, "data"),
    ("data a string", {**GOOD, "data": "{}"}, "data"),
    ("data null", {**GOOD, "data": None}, "data"),
    ("data with NUL in a string", {**GOOD, "data": {"s": "a\u0000b"}}, "data"),
    ("data with NUL in a key", {**GOOD, "data": {"a\u0000": 1}}, "data"),
]


@pytest.mark.parametrize(("body", "field"), [(b, f) for _, b, f in BAD_BODIES], ids=[n for n, _, _ in BAD_BODIES])
def test_bad_schedule_body_is_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    before = written(raw)
    response = client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    assert_problem(response, 400, field)
    assert written(raw) == before == (0, 0)


BAD_TEXTS: list[tuple[str, bytes]] = [
    ("NaN", b'{"item_key": "k", "data": {"x": NaN}}'),
    ("Infinity", b'{"item_key": "k", "data": {"x": Infinity}}'),
    ("-Infinity", b'{"item_key": "k", "data": {"x": -Infinity}}'),
    ("1e400", b'{"item_key": "k", "data": {"x": 1e400}}'),
    ("delay 1e400", b'{"item_key": "k", "delay_seconds": 1e400, "data": {}}'),
    ("invalid JSON", b'{"item_key": "k", "data": {}'),
    ("trailing garbage", b'{"item_key": "k", "data": {}} x'),
    ("empty body", b""),
    ("whitespace body", b"  \n"),
    ("array body", b'[{"item_key": "k", "data": {}}]'),
    ("string body", b'"hello"'),
    ("null body", b"null"),
    ("not UTF-8", b'{"item_key": "\xff", "data": {}}'),
    ("lone surrogate", b'{"item_key": "k", "data": {"s": "\\ud800"}}'),
    ("NUL escape in data", b'{"item_key": "k", "data": {"s": "\\u0000"}}'),
    ("deep nesting", b'{"item_key": "k", "data": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001),
]


def test_an_integer_written_with_a_zero_fraction_is_an_integer(client: FlaskClient, emails: str, token: str) -> None:
    # JSON has one number type, and /openapi.json's "integer" (JSON Schema) accepts 2.0.
    response = client.post("/v1/queues/emails/events", json={**GOOD, "max_attempts": 2.0}, headers=auth(token))
    assert response.status_code == 202, response.json
    assert response.json is not None and response.json["max_attempts"] == 2


@pytest.mark.parametrize("text", [t for _, t in BAD_TEXTS], ids=[n for n, _ in BAD_TEXTS])
def test_bad_json_text_is_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], text: bytes
) -> None:
    response = client.post(
        "/v1/queues/emails/events", data=text, headers={**auth(token), "Content-Type": "application/json"}
    )
    body = assert_problem(response, 400)
    assert body["errors"], body
    assert written(raw) == (0, 0)


@pytest.mark.parametrize(
    "item_key",
    ["welcome:ana@example.com", "a+b=c?d#e&f%g", "café-Ω-雪", "emoji-🙂", "100%", "k" * 255, "a.b..", "~!$'()*,;"],
)
def test_unusual_keys_are_accepted_and_round_trip(client: FlaskClient, emails: str, token: str, item_key: str) -> None:
    created = schedule(client, token, item_key, data={"k": item_key})
    assert created.status_code == 202, created.json
    assert created.json["item_key"] == item_key
    # The Location header points at the key, and following it finds the event.
    location = created.headers["Location"]
    assert client.get(location, headers=auth(token)).json["item_key"] == item_key
    got = client.get(key_url(item_key), headers=auth(token))
    assert got.status_code == 200
    assert got.json["item_key"] == item_key
    assert got.json["data"] == {"k": item_key}
    timeline = client.get(key_url(item_key, suffix="/timeline"), headers=auth(token))
    assert timeline.json["item_key"] == item_key
    patched = client.patch(key_url(item_key), json={"data": {"n": 2}}, headers=auth(token))
    assert patched.status_code == 200
    deleted = client.delete(key_url(item_key), headers=auth(token))
    assert deleted.json["status"] == "cancelled"


def test_encoded_slash_in_key_is_not_a_key(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, "a")
    response = client.get("/v1/queues/emails/events/a%2Fb", headers=auth(token))
    assert response.status_code == 404
    assert response.mimetype == PROBLEM


@pytest.fixture
def small_app(settings: Settings) -> Flask:
    app = create_app(settings.with_overrides(max_event_data_bytes=1000, max_body_bytes=20_000), configure_logs=False)
    yield app  # type: ignore[misc]
    close_app(app)


def test_data_over_the_limit_is_413(small_app: Flask, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    client = small_app.test_client()
    fits = schedule(client, token, "fits", data={"s": "x" * 900})
    assert fits.status_code == 202
    response = schedule(client, token, "big", data={"s": "x" * 1000})
    assert_problem(response, 413, "data")
    assert written(raw) == (1, 1)


def test_data_over_the_default_256_kib_is_413(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    response = schedule(client, token, "big", data={"s": "x" * (256 * 1024)})
    assert_problem(response, 413, "data")
    assert written(raw) == (0, 0)


def test_body_over_the_limit_is_413(small_app: Flask, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    client = small_app.test_client()
    body = b'{"item_key": "k", "data": {"s": "' + b"x" * 30_000 + b'"}}'
    response = client.post(
        "/v1/queues/emails/events", data=body, headers={**auth(token), "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.mimetype == PROBLEM
    assert written(raw) == (0, 0)


def test_batch_data_over_the_limit_is_413_naming_the_item(
    small_app: Flask, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    client = small_app.test_client()
    events = [{"item_key": "a", "data": {}}, {"item_key": "b", "data": {"s": "x" * 2000}}]
    response = client.post("/v1/queues/emails/events/batch", json={"events": events}, headers=auth(token))
    assert_problem(response, 413, "events[1].data")
    assert written(raw) == (0, 0)


BAD_PATCHES: list[tuple[str, dict[str, Any], str]] = [
    ("empty", {}, "body"),
    ("unknown field", {"item_key": "other"}, "item_key"),
    ("both times", {"schedule_on": "2030-01-01T00:00:00Z", "delay_seconds": 1}, "delay_seconds"),
    ("schedule_on without offset", {"schedule_on": "2030-01-01T00:00:00"}, "schedule_on"),
    ("negative delay", {"delay_seconds": -5}, "delay_seconds"),
    ("data a list", {"data": []}, "data"),
    ("data with NUL", {"data": {"s": "\u0000"}}, "data"),
    ("group_key with /", {"group_key": "a/b"}, "group_key"),
]


@pytest.mark.parametrize(("body", "field"), [(b, f) for _, b, f in BAD_PATCHES], ids=[n for n, _, _ in BAD_PATCHES])
def test_bad_patch_is_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    schedule(client, token, "k", delay_seconds=60)
    before = written(raw)
    assert_problem(client.patch(key_url("k"), json=body, headers=auth(token)), 400, field)
    assert written(raw) == before
    assert client.get(key_url("k"), headers=auth(token)).json["version"] == 1


BAD_QUERIES: list[tuple[str, str, str]] = [
    ("unknown status", "status=waiting", "status"),
    ("one bad status in a list", "status=pending,waiting", "status"),
    ("empty status", "status=", "status"),
    ("limit 0", "limit=0", "limit"),
    ("limit negative", "limit=-1", "limit"),
    ("limit too big", "limit=1001", "limit"),
    ("limit not a number", "limit=ten", "limit"),
    ("limit a decimal", "limit=1.5", "limit"),
    ("bad cursor", "cursor=nonsense", "cursor"),
    ("cursor of garbage base64", f"cursor={quote('fHw=')}", "cursor"),
    ("repeated param", "status=pending&status=dead", "status"),
    ("unknown param", "colour=red", "colour"),
    ("prefix with a space", "item_key_prefix=a%20b", "item_key_prefix"),
]


@pytest.mark.parametrize(("query", "field"), [(q, f) for _, q, f in BAD_QUERIES], ids=[n for n, _, _ in BAD_QUERIES])
def test_bad_search_query_is_refused(client: FlaskClient, emails: str, token: str, query: str, field: str) -> None:
    assert_problem(client.get(f"/v1/queues/emails/events?{query}", headers=auth(token)), 400, field)


def test_bad_cancel_reason_is_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, "k")
    before = written(raw)
    response = client.delete(key_url("k") + "?reason=" + quote("a\u0001b"), headers=auth(token))
    assert_problem(response, 400, "reason")
    response = client.delete(key_url("k") + "?colour=red", headers=auth(token))
    assert_problem(response, 400, "colour")
    assert written(raw) == before


def test_flask_404_and_405_are_problems(client: FlaskClient, emails: str, token: str) -> None:
    missing = client.get("/nowhere", headers=auth(token))
    assert missing.status_code == 404
    assert missing.mimetype == PROBLEM
    assert missing.json["status"] == 404
    wrong = client.put("/v1/queues/emails/events", json={}, headers=auth(token))
    assert wrong.status_code == 405
    assert wrong.mimetype == PROBLEM
    assert "POST" in wrong.headers["Allow"]
    wrong_ops = client.post("/healthz")
    assert wrong_ops.status_code == 405
    assert wrong_ops.mimetype == PROBLEM


def test_unknown_queue_and_key_are_404_problems(client: FlaskClient, emails: str, admin_token: str) -> None:
    for url in ("/v1/queues/nosuch/events/k", "/v1/queues/emails/events/never", "/v1/queues/Bad%20Name/events"):
        response = client.get(url, headers=auth(admin_token))
        assert response.status_code == 404, url
        assert response.mimetype == PROBLEM


def test_data_with_a_literal_backslash_u0000_is_not_a_nul(client: FlaskClient, emails: str, token: str) -> None:
    # The six characters \u0000 in a string are fine text; only a real NUL is refused.
    data = {"path": "C:\\u0000dir", "regex": "\\\\u0000"}
    created = schedule(client, token, "k", data=data)
    assert created.status_code == 202, created.json
    assert client.get(key_url("k"), headers=auth(token)).json["data"] == data
