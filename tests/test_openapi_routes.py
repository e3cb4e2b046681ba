"""/openapi.json and the routes agree: every route under /v1 is documented with its methods, every
documented operation exists, the documented patterns are the validators' rules, and answers that
carry more than the bare shape (a 409 with its event, a nack's counts) match their schemas."""

from __future__ import annotations

import re
from typing import Any

import jsonschema_rs
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import schedule
from tickler.api import patterns
from tickler.scheduler import rules
from tickler.scheduler.store import Store

IGNORED_METHODS = {"HEAD", "OPTIONS"}
# Routes outside /v1 that are deliberately not operations of the API document (`/` leads to /ui/).
UNDOCUMENTED = re.compile(r"^/((metrics|openapi\.json|docs|ui|static)\b|$)")


def _routes(app: Flask) -> set[tuple[str, str]]:
    found = set()
    for rule in app.url_map.iter_rules():
        if UNDOCUMENTED.match(rule.rule):
            continue
        path = re.sub(r"<(?:[a-z_]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        found |= {(path, method.lower()) for method in (rule.methods or set()) - IGNORED_METHODS}
    return found


def _documented(app: Flask) -> set[tuple[str, str]]:
    spec = app.extensions["tickler.openapi"]
    methods = {"get", "put", "post", "delete", "patch"}
    return {(path, method) for path, item in spec["paths"].items() for method in item if method in methods}


def test_every_route_is_documented(app: Flask) -> None:
    missing = sorted(_routes(app) - _documented(app))
    assert not missing, f"routes missing from api/openapi.py: {missing}"


def test_every_documented_operation_is_routed(app: Flask) -> None:
    ghosts = sorted(_documented(app) - _routes(app))
    assert not ghosts, f"documented in api/openapi.py but not routed: {ghosts}"


def _forbidden_ranges(refuses: Any) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for code in range(0x110000):
        if refuses(chr(code)):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return tuple(ranges)


def test_key_pattern_is_the_key_rule() -> None:
    assert _forbidden_ranges(lambda ch: rules.check_key(f"a{ch}b") is not None) == patterns.KEY_FORBIDDEN


def test_text_pattern_is_the_text_rule() -> None:
    assert _forbidden_ranges(lambda ch: rules.check_text(ch, 10) is not None) == patterns.TEXT_FORBIDDEN


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("welcome:ana@example.com", True),
        ("é✓𝄞", True),
        ("a/b", False),
        ("a b", False),
        ("a\u200bb", False),
        ("", False),
    ],
)
def test_key_pattern_reads_the_same_in_json_schema(value: str, valid: bool) -> None:
    validator = jsonschema_rs.validator_for({"type": "string", **patterns.key_metadata()})
    assert validator.is_valid(value) is valid
    assert (rules.check_key(value) is None) is valid


def _validator(app: Flask, path: str, method: str, status: int) -> Any:
    spec = app.extensions["tickler.openapi"]
    content = spec["paths"][path][method]["responses"][str(status)]["content"]
    schema = next(iter(content.values()))["schema"]
    return jsonschema_rs.validator_for({**schema, "components": spec["components"]})


def test_a_key_conflict_answer_matches_its_schema(
    app: Flask, client: FlaskClient, emails: str, admin_token: str
) -> None:
    schedule(client, admin_token, "k", delay_seconds=60)
    response = schedule(client, admin_token, "k", delay_seconds=60)
    assert response.status_code == 409 and "event" in response.json  # type: ignore[operator]
    errors = list(_validator(app, "/v1/queues/{queue}/events", "post", 409).iter_errors(response.json))
    assert not errors, [str(e) for e in errors]


def test_a_nack_answer_matches_its_schema(
    app: Flask, client: FlaskClient, emails: str, admin_token: str, store: Store
) -> None:
    schedule(client, admin_token, "k")
    claimed = client.post("/v1/queues/emails/claims", json={"worker": "w"}, headers=auth(admin_token)).json
    assert claimed is not None
    lease_id = claimed["leases"][0]["lease_id"]
    response = client.post(f"/v1/leases/{lease_id}/nack", json={"error": "boom"}, headers=auth(admin_token))
    assert response.status_code == 200 and "retry_at" in response.json  # type: ignore[operator]
    errors = list(_validator(app, "/v1/leases/{lease_id}/nack", "post", 200).iter_errors(response.json))
    assert not errors, [str(e) for e in errors]


def test_every_endpoint_beside_item_key_is_listed(app: Flask) -> None:
    prefix = "/v1/queues/<queue>/events/"
    segments = {rule.rule.removeprefix(prefix) for rule in app.url_map.iter_rules() if rule.rule.startswith(prefix)}
    static = {segment for segment in segments if "/" not in segment and "<" not in segment}
    assert static == set(rules.ENDPOINT_SEGMENTS), "list new /events/<segment> endpoints in rules.ENDPOINT_SEGMENTS"


@pytest.mark.parametrize("action", rules.ENDPOINT_SEGMENTS)
@pytest.mark.parametrize("method", ["get", "patch", "delete"])
def test_endpoints_beside_item_key_allow_only_post(
    client: FlaskClient, emails: str, admin_token: str, action: str, method: str
) -> None:
    response = client.open(f"/v1/queues/emails/events/{action}", method=method.upper(), headers=auth(admin_token))
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["Allow"].split(",")} == {"POST", "OPTIONS"}


@pytest.mark.parametrize("key", rules.ENDPOINT_SEGMENTS)
def test_keys_that_name_endpoints_are_refused(client: FlaskClient, emails: str, admin_token: str, key: str) -> None:
    response = schedule(client, admin_token, key)
    assert response.status_code == 400 and "item_key" in response.json["errors"]  # type: ignore[index]
    batch = {"events": [{"item_key": key, "data": {}}]}
    response = client.post("/v1/queues/emails/events/batch", json=batch, headers=auth(admin_token))
    assert response.status_code == 400 and "events[0].item_key" in response.json["errors"]  # type: ignore[index]
