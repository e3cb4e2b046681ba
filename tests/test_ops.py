"""Operations endpoints: health, readiness, metrics, the OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from flask import Flask
from flask.testing import FlaskClient
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from tests import pg
from tests.conftest import auth
from tests.helpers import PROBLEM, schedule
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.migrate import migrate


def test_healthz(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json == {"status": "ok"}


def test_readyz_when_migrated(client: FlaskClient, database_url: str) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.json


@pytest.fixture
def empty_database_app(admin_url: str, settings: Settings) -> Iterator[tuple[Flask, str]]:
    url = pg.create_database(admin_url, prefix="tickler_unready")
    app = create_app(settings.with_overrides(database_url=url, migrate_on_start=False), configure_logs=False)
    try:
        yield app, url
    finally:
        close_app(app)
        pg.drop_database(admin_url, url)


def test_readyz_is_503_while_migrations_are_pending(empty_database_app: tuple[Flask, str]) -> None:
    app, url = empty_database_app
    client = app.test_client()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.mimetype == PROBLEM
    assert "0001_schema" in response.json["detail"]
    assert client.get("/healthz").status_code == 200  # alive, just not ready
    migrate(url)
    assert client.get("/readyz").status_code == 200


def test_readyz_is_503_when_the_database_is_gone(settings: Settings) -> None:
    app = create_app(
        settings.with_overrides(database_url="postgresql://nobody@127.0.0.1:1/none", migrate_on_start=False),
        configure_logs=False,
    )
    try:
        response = app.test_client().get("/readyz")
        assert response.status_code == 503
        assert response.mimetype == PROBLEM
    finally:
        close_app(app)


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[1]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match[2])
    return 0.0


def test_metrics_count_requests_and_scheduling_outcomes(client: FlaskClient, emails: str, token: str) -> None:
    before = client.get("/metrics").get_data(as_text=True)
    schedule(client, token, "m1")
    schedule(client, token, "m1")  # 409
    schedule(client, token, "m1", on_conflict="ignore")
    schedule(client, token, "m1", on_conflict="replace")
    client.post(
        "/v1/queues/emails/events/batch",
        json={"events": [{"item_key": "m1", "data": {}}, {"item_key": "m2", "data": {}}]},
        headers=auth(token),
    )
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype.startswith("text/plain")
    after = response.get_data(as_text=True)

    def grew(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert grew("tickler_events_scheduled_total", queue="emails", outcome="created") == 2
    assert grew("tickler_events_scheduled_total", queue="emails", outcome="ignored") == 1
    assert grew("tickler_events_scheduled_total", queue="emails", outcome="replaced") == 1
    assert grew("tickler_events_scheduled_total", queue="emails", outcome="rejected") == 2
    route = "/v1/queues/<queue>/events"
    assert grew("tickler_http_requests_total", route=route, method="POST", status="202") == 1
    assert grew("tickler_http_requests_total", route=route, method="POST", status="409") == 1
    assert grew("tickler_http_requests_total", route=route, method="POST", status="200") == 2


def test_metrics_token(settings: Settings) -> None:
    app = create_app(settings.with_overrides(metrics_token="s3cret"), configure_logs=False)
    try:
        client = app.test_client()
        refused = client.get("/metrics")
        assert refused.status_code == 401 and refused.mimetype == PROBLEM
        assert client.get("/metrics", headers=auth("wrong")).status_code == 401
        assert client.get("/metrics", headers=auth("s3cret")).status_code == 200
    finally:
        close_app(app)


def test_openapi_is_valid_and_names_every_v1_path(app: Flask, client: FlaskClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    spec: dict[str, Any] = response.json
    assert spec["openapi"].startswith("3.1")
    # The OpenAPI 3.1 meta-schema, and JSON Schema 2020-12 for each schema it holds.
    assert [e.message for e in OPENAPI_31_VALIDATOR.iter_errors(spec)] == []
    for name, schema in spec["components"]["schemas"].items():
        assert jsonschema_rs.meta.is_valid(schema), name
    documented = set(spec["paths"])
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        assert path in documented, path
        methods = {m.lower() for m in rule.methods or ()} - {"head", "options"}
        assert methods <= set(spec["paths"][path]), (path, methods)
