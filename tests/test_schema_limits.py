"""/openapi.json states the limits the validators hold, and inputs are checked before the database
sees them: a schedules cursor with a NUL, an unknown time zone, a cron expression out of range,
a search cursor that is not one, a time before 1970 — each a 400 naming its field."""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import available_timezones

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import auth
from tickler.api import patterns
from tickler.scheduler import cron

SCHEDULE = {"cron": "0 8 * * 1-5", "timezone": "Europe/Berlin", "data": {}}


def _property(app: Flask, path: str, method: str, name: str) -> dict[str, Any]:
    spec = app.extensions["tickler.openapi"]
    operation = spec["paths"][path][method]
    for parameter in operation.get("parameters", []):
        if parameter["name"] == name:
            return dict(parameter["schema"])
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return dict(schema["properties"][name])


def _errors(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, response.json
    assert response.content_type == "application/problem+json"
    return dict(response.json["errors"])


def _schedule_errors(client: FlaskClient, token: str, **fields: Any) -> dict[str, Any]:
    """The errors of the 400 that refuses the schedule "daily" put as SCHEDULE with `fields` changed."""
    response = client.put("/v1/queues/emails/schedules/daily", json=SCHEDULE | fields, headers=auth(token))
    return _errors(response)


def test_a_schedules_cursor_is_checked_before_the_database(client: FlaskClient, token: str, emails: str) -> None:
    response = client.get("/v1/queues/emails/schedules?cursor=a%00b", headers=auth(token))
    assert "cursor" in _errors(response)
    assert "database" not in response.json["detail"].lower()


def test_the_schedules_cursor_is_documented_as_a_key(app: Flask) -> None:
    cursor = _property(app, "/v1/queues/{queue}/schedules", "get", "cursor")
    assert cursor["pattern"] == patterns.KEY_PATTERN


def test_time_zones_are_listed_and_an_unknown_one_is_refused(
    app: Flask, client: FlaskClient, token: str, emails: str
) -> None:
    timezone = _property(app, "/v1/queues/{queue}/schedules/{schedule_key}", "put", "timezone")
    assert set(timezone["x-time-zones"]) == set(available_timezones()) and "Europe/Berlin" in timezone["x-time-zones"]
    assert "timezone" in _schedule_errors(client, token, timezone="Mars/Olympus_Mons")


READ = ["0 8 * * 1-5", "*/15 * * * *", "0 0 1 jan *", "0 0 1 JAN *", "0 9 * * mon-fri", "5 4 * * 7", "5/2 * * * *"]
READ += ["0 8,9 1-15/2 */3 0", "00 * * * *", "1-5/002 * * * *", "0 0 * 1,feb-mar *", " 0 0 * * sun "]
REFUSED = ["60 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 8", "*/0 * * * *", "a b c d e"]
REFUSED += ["0 8 * *", "last * * * *", "0 0 * * funday"]


@pytest.mark.parametrize("expression", READ)
def test_the_cron_pattern_admits_what_the_parser_reads(expression: str) -> None:
    cron.parse(expression, "UTC")
    assert re.match(patterns.CRON_PATTERN, expression)


@pytest.mark.parametrize("expression", REFUSED)
def test_the_cron_pattern_refuses_what_the_parser_refuses(
    expression: str, app: Flask, client: FlaskClient, token: str, emails: str
) -> None:
    with pytest.raises(ValueError):
        cron.parse(expression, "UTC")
    assert not re.match(patterns.CRON_PATTERN, expression)
    assert "cron" in _schedule_errors(client, token, cron=expression)


def test_the_cron_field_is_documented_with_its_pattern(app: Flask) -> None:
    expression = _property(app, "/v1/queues/{queue}/schedules/{schedule_key}", "put", "cron")
    assert expression["pattern"] == patterns.CRON_PATTERN


def test_a_search_cursor_outside_the_alphabet_is_refused_as_documented(
    app: Flask, client: FlaskClient, token: str, emails: str
) -> None:
    assert _property(app, "/v1/queues/{queue}/events", "get", "cursor")["pattern"] == patterns.CURSOR_PATTERN
    assert "cursor" in _errors(client.get("/v1/queues/emails/events?cursor=not%20a%20cursor", headers=auth(token)))


def test_a_time_before_1970_is_refused_and_the_limit_documented(
    app: Flask, client: FlaskClient, token: str, emails: str
) -> None:
    body = {"item_key": "k", "schedule_on": "1969-12-31T23:59:59Z", "data": {}}
    assert "schedule_on" in _errors(client.post("/v1/queues/emails/events", json=body, headers=auth(token)))
    assert "1970" in _property(app, "/v1/queues/{queue}/events", "post", "schedule_on")["description"]
