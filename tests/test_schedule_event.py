"""`POST /v1/queues/{queue}/events` as a client sees it: the response's status, headers (in their
order) and body, the Location url_for would write, every refusal as problem+json, the access log
line and the metrics. Every such request takes the one view (api/events.py `schedule`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from flask import Flask, url_for
from flask.testing import FlaskClient
from marshmallow import ValidationError
from prometheus_client import REGISTRY

from tickler.api import close_app, create_app
from tickler.api.problems import flatten_errors
from tickler.api.schemas.events import ScheduleEventSchema
from tickler.config import Settings

from .conftest import auth

ROUTE = "/v1/queues/<queue>/events"


def _counter(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _compact(body: Any) -> bytes:
    """What jsonify writes: compact JSON, UTF-8 as is, and a newline."""
    return (json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def test_a_created_event_is_answered_with_its_headers_in_order(
    client: FlaskClient, app: Flask, emails: str, token: str
) -> None:
    body = {"item_key": "welcome:1", "schedule_on": "2031-01-02T03:04:05+02:00", "data": {"to": "ü@x"}}
    response = client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    assert response.status_code == 202
    assert response.status == "202 ACCEPTED"
    answer = response.get_json()
    assert answer["outcome"] == "created" and answer["schedule_on"] == "2031-01-02T01:04:05Z"
    assert [k for k, _ in response.headers.items()] == [
        "Content-Type",
        "Content-Length",
        "ETag",
        "Location",
        "X-Request-Id",
    ]
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["ETag"] == f'"{answer["version"]}"'
    assert response.headers["Location"] == "/v1/queues/emails/events/welcome:1"
    assert response.get_data() == _compact(answer)
    assert int(response.headers["Content-Length"]) == len(response.get_data())


@pytest.mark.parametrize("key", ["plain", "with space", "ä/ö?#%", "a;b=c@d", "x" * 200])
@pytest.mark.parametrize("base_url", ["http://localhost/", "http://localhost/api/"])
def test_the_location_is_url_fors(
    client: FlaskClient, app: Flask, emails: str, token: str, key: str, base_url: str
) -> None:
    body = {"item_key": key, "delay_seconds": 3600, "data": {}, "on_conflict": "ignore"}
    response = client.post("/v1/queues/emails/events", json=body, headers=auth(token), base_url=base_url)
    if "/" in key or " " in key:  # beyond the key rules
        assert response.status_code == 400
        return
    assert response.status_code in (200, 202)
    with app.test_request_context("/", base_url=base_url):
        expected = url_for("v1.events.get_event", queue="emails", item_key=key)
    assert response.headers["Location"] == expected


@pytest.mark.parametrize("on_conflict", ["ignore", "replace", "debounce"])
def test_outcomes_other_than_created(client: FlaskClient, emails: str, token: str, on_conflict: str) -> None:
    body = {"item_key": "k", "schedule_on": "2031-01-02T03:04:05Z", "data": {"n": 1}}
    first = client.post("/v1/queues/emails/events", json=body, headers=auth(token)).get_json()
    before = _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": f"{on_conflict}d"})
    response = client.post("/v1/queues/emails/events", json={**body, "on_conflict": on_conflict}, headers=auth(token))
    assert response.status_code == 200
    answer = response.get_json()
    assert answer["outcome"] == f"{on_conflict}d" and answer["id"] == first["id"]
    assert answer["version"] == (1 if on_conflict == "ignore" else 2)
    assert response.headers["ETag"] == f'"{answer["version"]}"'
    assert response.get_data() == _compact(answer)
    after = _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": f"{on_conflict}d"})
    assert after == before + 1


REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("no body", {"data": b""}),
    ("white space", {"data": b"  \n"}),
    ("not JSON", {"data": b"{nope"}),
    ("a key named twice", {"data": b'{"item_key":"a","item_key":"b","data":{}}'}),
    ("an array", {"data": b"[]"}),
    ("no key", {"json": {"data": {}}}),
    ("an unknown field", {"json": {"item_key": "a", "data": {}, "colour": "red"}}),
    ("both times", {"json": {"item_key": "a", "delay_seconds": 1, "schedule_on": "2031-01-01T00:00:00Z"}}),
    ("a time without offset", {"json": {"item_key": "a", "schedule_on": "2031-01-01T00:00:00"}}),
    ("a NUL in the data", {"data": b'{"item_key":"a","data":{"x":"\\u0000"}}'}),
    ("a bad on_conflict", {"json": {"item_key": "a", "on_conflict": "overwrite"}}),
    ("NaN", {"data": b'{"item_key":"a","data":{"x":NaN}}'}),
]


@pytest.mark.parametrize(("what", "request_body"), REFUSED, ids=[what for what, _ in REFUSED])
def test_refused_bodies_are_problems(
    client: FlaskClient, emails: str, token: str, what: str, request_body: dict[str, Any]
) -> None:
    response = client.post("/v1/queues/emails/events", headers=auth(token), **request_body)
    assert response.status_code == 400, what
    assert response.content_type == "application/problem+json"
    problem = response.get_json()
    assert problem["type"] == "https://tickler.dev/problems/validation" and problem["errors"], what
    if "json" in request_body:  # the schema's own messages, field by field
        with pytest.raises(ValidationError) as refused:
            ScheduleEventSchema().load(request_body["json"])
        assert problem["errors"] == flatten_errors(refused.value.messages)
    # nothing was written
    assert client.get("/v1/queues/emails/events/a", headers=auth(token)).status_code == 404


def test_callers_and_queues_refused(client: FlaskClient, store: Any, emails: str, token: str) -> None:
    other = store.tokens.create("billing-service", queues=["billing"])
    cases = [
        ("/v1/queues/emails/events", {}, 401),
        ("/v1/queues/emails/events", {"Authorization": "Bearer nope"}, 401),
        ("/v1/queues/emails/events", {"Authorization": f"Basic {token}"}, 401),
        ("/v1/queues/emails/events", auth(other), 404),
        ("/v1/queues/nowhere/events", auth(token), 404),
        ("/v1/queues/Emails/events", auth(token), 404),
    ]
    for path, headers, status in cases:
        response = client.post(path, json={"item_key": "a", "data": {}}, headers=headers)
        assert response.status_code == status, (path, headers)
        assert response.content_type == "application/problem+json"
        if status == 401:
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="tickler"'


def test_a_conflict_carries_the_existing_event(client: FlaskClient, emails: str, token: str) -> None:
    body = {"item_key": "taken", "delay_seconds": 60, "data": {}}
    first = client.post("/v1/queues/emails/events", json=body, headers=auth(token)).get_json()
    before = _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": "rejected"})
    response = client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    assert response.status_code == 409
    problem = response.get_json()
    assert problem["type"] == "https://tickler.dev/problems/key-conflict"
    assert problem["event"]["id"] == first["id"]
    assert _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": "rejected"}) == before + 1


def test_a_trace_header_changes_nothing_and_a_query_string_is_refused(
    client: FlaskClient, emails: str, token: str
) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = {"item_key": "traced", "delay_seconds": 60, "data": {}}
    response = client.post("/v1/queues/emails/events", json=body, headers={**auth(token), "traceparent": traceparent})
    assert response.status_code == 202
    assert response.headers["Location"] == "/v1/queues/emails/events/traced"
    # unknown fields are errors, in the query string too: 400 naming it, nothing written
    body = {"item_key": "query", "delay_seconds": 60, "data": {}}
    refused = client.post("/v1/queues/emails/events", json=body, headers=auth(token), query_string={"x": "1"})
    assert refused.status_code == 400 and "x" in refused.json["errors"]
    assert client.get("/v1/queues/emails/events/query", headers=auth(token)).status_code == 404
    for method in ("GET", "PUT", "PATCH"):
        response = client.open("/v1/queues/emails/events", method=method, json={}, headers=auth(token))
        assert response.status_code in (200, 400, 405), method


def test_the_request_id_given_is_kept_and_a_bad_one_replaced(client: FlaskClient, emails: str, token: str) -> None:
    body = {"item_key": "rid", "delay_seconds": 60, "data": {}, "on_conflict": "ignore"}
    given = client.post("/v1/queues/emails/events", json=body, headers={**auth(token), "X-Request-Id": "abc-1.2:3"})
    assert given.headers["X-Request-Id"] == "abc-1.2:3"
    made = client.post("/v1/queues/emails/events", json=body, headers={**auth(token), "X-Request-Id": "no spaces"})
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-Id"])


def test_the_access_log_line_and_the_metrics(client: FlaskClient, emails: str, token: str) -> None:
    body = {"item_key": "logged", "delay_seconds": 60, "data": {}}
    requests = {"route": ROUTE, "method": "POST", "status": "202"}
    counters = (
        ("tickler_http_requests_total", requests),
        ("tickler_http_request_duration_seconds_count", {"route": ROUTE}),
        ("tickler_events_scheduled_total", {"queue": "emails", "outcome": "created"}),
    )
    before = [_counter(name, labels) for name, labels in counters]
    with structlog.testing.capture_logs() as logs:
        response = client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    assert response.status_code == 202
    lines = [line for line in logs if line["event"] == "request"]
    assert len(lines) == 1
    assert lines[0].pop("duration_ms") >= 0
    assert lines[0] == {
        "event": "request",
        "log_level": "info",
        "method": "POST",
        "path": "/v1/queues/emails/events",
        "route": ROUTE,
        "status": 202,
        "principal": "signup-service",
    }
    assert [_counter(name, labels) - b for (name, labels), b in zip(counters, before, strict=True)] == [1, 1, 1]


@pytest.fixture
def small_app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings.with_overrides(max_body_bytes=400, max_event_data_bytes=64), configure_logs=False)
    yield app
    close_app(app)


def test_the_limits(small_app: Flask, emails: str, token: str) -> None:
    client = small_app.test_client()
    cases = [
        ({"item_key": "big", "data": {"x": "y" * 100}}, 413, {"data"}),  # data over the limit
        ({"item_key": "huge", "data": {"x": "y" * 500}}, 413, None),  # body over the limit
        ({"item_key": "fits", "data": {"x": "y" * 10}}, 202, None),
    ]
    for body, status, fields in cases:
        response = client.post("/v1/queues/emails/events", json=body, headers=auth(token))
        assert response.status_code == status, body["item_key"]
        if fields is not None:
            assert set(response.get_json()["errors"]) == fields
