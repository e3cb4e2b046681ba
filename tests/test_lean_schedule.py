"""The lean single-event schedule (api/lean.py) answers exactly as the Flask view does.

Every request here is sent twice: through the lean route and through Flask alone (the route
switched off), and the two responses are compared: status, headers (but the request id and the
date) and body, byte for byte where nothing in them is made anew by the write (an event's id and
enqueue time; its due time when given as a delay).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from tickler.api import close_app, create_app
from tickler.api.lean import ROUTE, LeanSchedule
from tickler.config import Settings

from .conftest import auth

Send = Callable[..., Any]


def _lean(app: Flask) -> LeanSchedule:
    route: LeanSchedule = app.extensions["tickler.lean"]
    return route


@pytest.fixture
def both(client: FlaskClient, app: Flask) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """send(method, path, **kwargs) -> (the lean route's response, Flask's response), after the
    `setup(mode)` given (run before each send)."""
    route = _lean(app)

    def send(*args: Any, setup: Callable[[], object] | None = None, **kwargs: Any) -> tuple[Any, Any]:
        answers = []
        for enabled in (True, False):
            if setup is not None:
                setup()
            route.enabled = enabled
            try:
                answers.append(client.open(*args, **kwargs))
            finally:
                route.enabled = True
        return answers[0], answers[1]

    yield send
    route.enabled = True


_MADE_ANEW = [
    (re.compile(rb'"id":\d+'), b'"id":0'),
    (re.compile(rb'"enqueued_on":"[^"]*"'), b'"enqueued_on":""'),
    (re.compile(rb'"schedule_on":"[^"]*"'), b'"schedule_on":""'),  # delay_seconds: from the write's time
]


def _same(lean: Any, flask: Any, *, made_anew: bool = False) -> None:
    assert lean.status == flask.status
    lean_headers = [(k, v) for k, v in lean.headers.items() if k not in ("X-Request-Id", "Date")]
    flask_headers = [(k, v) for k, v in flask.headers.items() if k not in ("X-Request-Id", "Date")]
    assert lean_headers == flask_headers
    assert "X-Request-Id" in lean.headers and "X-Request-Id" in flask.headers
    lean_body, flask_body = lean.get_data(), flask.get_data()
    if made_anew:
        for pattern, spelled in _MADE_ANEW:
            lean_body, flask_body = pattern.sub(spelled, lean_body), pattern.sub(spelled, flask_body)
    assert lean_body == flask_body


def _cancel(client: FlaskClient, token: str, key: str) -> Callable[[], object]:
    return lambda: client.delete(f"/v1/queues/emails/events/{key}", headers=auth(token))


def test_a_created_event_is_answered_the_same(
    both: Callable[..., tuple[Any, Any]], client: FlaskClient, app: Flask, emails: str, token: str
) -> None:
    taken = _lean(app).taken
    body = {"item_key": "welcome:1", "schedule_on": "2031-01-02T03:04:05+02:00", "data": {"to": "ü@x"}}
    first = client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    assert first.status_code == 202
    assert _lean(app).taken == taken + 1  # the lean route answered it
    lean, flask = both(
        "/v1/queues/emails/events",
        method="POST",
        json=body,
        headers=auth(token),
        setup=_cancel(client, token, "welcome:1"),
    )
    assert lean.status_code == 202
    _same(lean, flask, made_anew=True)
    assert _lean(app).taken == taken + 2


@pytest.mark.parametrize(
    "key",
    ["plain", "with space", "ä/ö?#%", "a;b=c@d", "x" * 200],
)
def test_the_location_is_url_fors(
    both: Callable[..., tuple[Any, Any]], client: FlaskClient, emails: str, token: str, key: str
) -> None:
    body = {"item_key": key, "delay_seconds": 3600, "data": {}}
    client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    lean, flask = both(
        "/v1/queues/emails/events",
        method="POST",
        json={**body, "on_conflict": "ignore"},
        headers=auth(token),
    )
    assert lean.status_code in (200, 400)  # keys beyond the rules are refused alike
    _same(lean, flask)


@pytest.mark.parametrize("on_conflict", ["ignore", "replace", "debounce"])
def test_outcomes_other_than_created_are_answered_the_same(
    both: Callable[..., tuple[Any, Any]], client: FlaskClient, app: Flask, emails: str, token: str, on_conflict: str
) -> None:
    body = {"item_key": "k", "schedule_on": "2031-01-02T03:04:05Z", "data": {"n": 1}}
    client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    taken = _lean(app).taken
    lean, flask = both(
        "/v1/queues/emails/events", method="POST", json={**body, "on_conflict": on_conflict}, headers=auth(token)
    )
    assert lean.status_code == 200
    assert _lean(app).taken == taken + 1
    if on_conflict == "ignore":
        _same(lean, flask)
    else:  # each send writes a version of its own
        assert lean.get_json()["version"] + 1 == flask.get_json()["version"]
        assert lean.headers["ETag"] == f'"{lean.get_json()["version"]}"'
        lean_body = lean.get_data().replace(b'"version":2', b'"version":3')
        assert lean_body == flask.get_data()
        assert [(k, v) for k, v in lean.headers.items() if k not in ("X-Request-Id", "ETag")] == [
            (k, v) for k, v in flask.headers.items() if k not in ("X-Request-Id", "ETag")
        ]


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
def test_refused_bodies_are_flasks(
    both: Callable[..., tuple[Any, Any]], app: Flask, emails: str, token: str, what: str, request_body: dict[str, Any]
) -> None:
    taken = _lean(app).taken
    lean, flask = both("/v1/queues/emails/events", method="POST", headers=auth(token), **request_body)
    assert lean.status_code == 400, what
    assert lean.content_type == "application/problem+json"
    _same(lean, flask)
    assert _lean(app).taken == taken


def test_callers_and_queues_refused_are_flasks(
    both: Callable[..., tuple[Any, Any]], app: Flask, store: Any, emails: str, token: str
) -> None:
    other = store.tokens.create("billing-service", queues=["billing"])
    body = {"json": {"item_key": "a", "data": {}}}
    cases = [
        ("/v1/queues/emails/events", {}, 401),
        ("/v1/queues/emails/events", {"Authorization": "Bearer nope"}, 401),
        ("/v1/queues/emails/events", {"Authorization": f"Basic {token}"}, 401),
        ("/v1/queues/emails/events", auth(other), 404),
        ("/v1/queues/nowhere/events", auth(token), 404),
        ("/v1/queues/Emails/events", auth(token), 404),
    ]
    taken = _lean(app).taken
    for path, headers, status in cases:
        lean, flask = both(path, method="POST", headers=headers, **body)
        assert lean.status_code == status, (path, headers)
        _same(lean, flask)
    assert _lean(app).taken == taken


def test_a_conflict_is_answered_by_flask_with_the_existing_event(
    both: Callable[..., tuple[Any, Any]], client: FlaskClient, app: Flask, emails: str, token: str
) -> None:
    body = {"item_key": "taken", "delay_seconds": 60, "data": {}}
    client.post("/v1/queues/emails/events", json=body, headers=auth(token))
    before = _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": "rejected"})
    taken = _lean(app).taken
    lean, flask = both("/v1/queues/emails/events", method="POST", json=body, headers=auth(token))
    assert lean.status_code == 409
    _same(lean, flask)
    assert _lean(app).taken == taken  # the store call was the lean route's, the answer Flask's
    # counted once per request, as before
    assert _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": "rejected"}) == before + 2


def test_unusual_requests_go_to_flask_and_are_answered_the_same(
    both: Callable[..., tuple[Any, Any]], client: FlaskClient, app: Flask, emails: str, token: str
) -> None:
    taken = _lean(app).taken
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for key, extra in (
        ("query", {"query_string": {"x": "1"}}),
        ("traced", {"headers": {**auth(token), "traceparent": traceparent}}),
        ("prefixed", {"base_url": "http://localhost/api/"}),
    ):
        kwargs: dict[str, Any] = {"headers": auth(token), **extra}
        body = {"item_key": key, "delay_seconds": 60, "data": {}}
        lean, flask = both(
            "/v1/queues/emails/events", method="POST", json=body, setup=_cancel(client, token, key), **kwargs
        )
        assert lean.status_code == 202, key
        _same(lean, flask, made_anew=True)
    for method in ("GET", "PUT", "PATCH"):
        lean, flask = both("/v1/queues/emails/events", method=method, json={}, headers=auth(token))
        _same(lean, flask)
    assert _lean(app).taken == taken


def test_the_request_id_given_is_kept_and_a_bad_one_replaced(
    client: FlaskClient, app: Flask, emails: str, token: str
) -> None:
    taken = _lean(app).taken
    body = {"item_key": "rid", "delay_seconds": 60, "data": {}, "on_conflict": "ignore"}
    given = client.post("/v1/queues/emails/events", json=body, headers={**auth(token), "X-Request-Id": "abc-1.2:3"})
    assert given.headers["X-Request-Id"] == "abc-1.2:3"
    made = client.post("/v1/queues/emails/events", json=body, headers={**auth(token), "X-Request-Id": "no spaces"})
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-Id"])
    assert _lean(app).taken == taken + 2


def _counter(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_access_log_and_the_metrics_are_flasks(
    both: Callable[..., tuple[Any, Any]], client: FlaskClient, app: Flask, emails: str, token: str
) -> None:
    body = {"item_key": "logged", "delay_seconds": 60, "data": {}}
    requests = {"route": ROUTE, "method": "POST", "status": "202"}
    before = (
        _counter("tickler_http_requests_total", requests),
        _counter("tickler_http_request_duration_seconds_count", {"route": ROUTE}),
        _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": "created"}),
    )
    with structlog.testing.capture_logs() as logs:
        lean, flask = both(
            "/v1/queues/emails/events",
            method="POST",
            json=body,
            headers=auth(token),
            setup=_cancel(client, token, "logged"),
        )
    assert (lean.status_code, flask.status_code) == (202, 202)
    lines = [line for line in logs if line["event"] == "request" and line["method"] == "POST"]
    assert len(lines) == 2
    for line in lines:
        assert line.pop("duration_ms") >= 0
    assert (
        lines[0]
        == lines[1]
        == {
            "event": "request",
            "log_level": "info",
            "method": "POST",
            "path": "/v1/queues/emails/events",
            "route": ROUTE,
            "status": 202,
            "principal": "signup-service",
        }
    )
    after = (
        _counter("tickler_http_requests_total", requests),
        _counter("tickler_http_request_duration_seconds_count", {"route": ROUTE}),
        _counter("tickler_events_scheduled_total", {"queue": "emails", "outcome": "created"}),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2, 2]


@pytest.fixture
def small_app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings.with_overrides(max_body_bytes=400, max_event_data_bytes=64), configure_logs=False)
    yield app
    close_app(app)


def test_the_limits_are_flasks(small_app: Flask, emails: str, token: str) -> None:
    client = small_app.test_client()
    route = _lean(small_app)
    cases = [
        ({"item_key": "big", "data": {"x": "y" * 100}}, 413),  # data over the limit
        ({"item_key": "huge", "data": {"x": "y" * 500}}, 413),  # body over the limit
        ({"item_key": "fits", "data": {"x": "y" * 10}}, 202),
    ]
    for body, status in cases:
        answers = []
        for enabled in (True, False):
            client.delete(f"/v1/queues/emails/events/{body['item_key']}", headers=auth(token))
            route.enabled = enabled
            try:
                answers.append(client.post("/v1/queues/emails/events", json=body, headers=auth(token)))
            finally:
                route.enabled = True
        assert answers[0].status_code == status, body["item_key"]
        _same(answers[0], answers[1], made_anew=True)
    assert route.taken == 1
