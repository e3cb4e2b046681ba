"""Client input that once reached a 500 or was read two ways: each is a 4xx problem now.

Timestamps past datetime's range once converted to UTC, non-ASCII digits in If-Match, the keys
`.` and `..`, JSON objects naming a key twice, and chunked bodies over the limit.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, schedule, written
from tests.helpers_http import serving_app
from tickler.api import close_app, create_app
from tickler.config import Settings

OUT_OF_RANGE = ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+01:00"]


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_time_out_of_range_in_utc_is_a_field_error_on_post(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], when: str
) -> None:
    response = client.post("/v1/queues/emails/events", json={"item_key": "k", "schedule_on": when, "data": {}},
                           headers=auth(token))  # fmt: skip
    assert_problem(response, 400, "schedule_on")
    assert written(raw) == (0, 0)


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_time_out_of_range_in_utc_is_a_field_error_on_patch(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], when: str
) -> None:
    schedule(client, token, "k", delay_seconds=60)
    before = written(raw)
    assert_problem(client.patch(key_url("k"), json={"schedule_on": when}, headers=auth(token)), 400, "schedule_on")
    assert written(raw) == before


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_time_out_of_range_in_utc_is_a_field_error_in_a_batch(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], when: str
) -> None:
    body = {"events": [{"item_key": "a", "data": {}}, {"item_key": "b", "schedule_on": when, "data": {}}]}
    response = client.post("/v1/queues/emails/events/batch", json=body, headers=auth(token))
    problem = assert_problem(response, 400)
    assert "schedule_on" in str(problem["errors"]), problem
    assert written(raw) == (0, 0)


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_time_out_of_range_in_a_tampered_cursor_is_a_field_error(
    client: FlaskClient, emails: str, token: str, when: str
) -> None:
    cursor = base64.urlsafe_b64encode(f"{when}|1".encode()).decode().rstrip("=")
    response = client.get(f"/v1/queues/emails/events?cursor={quote(cursor)}", headers=auth(token))
    assert_problem(response, 400, "cursor")


def test_an_id_past_bigint_in_a_tampered_cursor_is_a_field_error(client: FlaskClient, emails: str, token: str) -> None:
    cursor = base64.urlsafe_b64encode(f"2030-01-01T00:00:00Z|{10**30}".encode()).decode().rstrip("=")
    response = client.get(f"/v1/queues/emails/events?cursor={quote(cursor)}", headers=auth(token))
    assert_problem(response, 400, "cursor")


@pytest.mark.parametrize("tag", ['"²"', '"\u0661"', '"1²"'])
def test_if_match_with_non_ascii_digits_matches_nothing(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], tag: str
) -> None:
    schedule(client, token, "k", delay_seconds=60)
    before = written(raw)
    headers = {**auth(token), "If-Match": tag}
    assert client.patch(key_url("k"), json={"data": {"n": 1}}, headers=headers).status_code == 412
    assert client.delete(key_url("k"), headers=headers).status_code == 412
    assert written(raw) == before


@pytest.mark.parametrize("key", [".", ".."])
def test_dot_keys_are_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], key: str
) -> None:
    assert_problem(schedule(client, token, key), 400, "item_key")
    batch = {"events": [{"item_key": key, "data": {}}]}
    assert_problem(client.post("/v1/queues/emails/events/batch", json=batch, headers=auth(token)), 400)
    assert written(raw) == (0, 0)


@pytest.mark.parametrize("key", [".a", "a.", "...", "a..b"])
def test_other_dotted_keys_are_fine(client: FlaskClient, emails: str, token: str, key: str) -> None:
    assert schedule(client, token, key).status_code == 202


DUPLICATED = [
    ("at the top", b'{"item_key": "a", "item_key": "b", "data": {}}'),
    ("inside data", b'{"item_key": "k", "data": {"x": 1, "x": 2}}'),
    ("deep inside data", b'{"item_key": "k", "data": {"l": [{"y": 1, "y": 1}]}}'),
]


@pytest.mark.parametrize("text", [t for _, t in DUPLICATED], ids=[n for n, _ in DUPLICATED])
def test_a_key_named_twice_in_an_object_is_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], text: bytes
) -> None:
    headers = {**auth(token), "Content-Type": "application/json"}
    body = assert_problem(client.post("/v1/queues/emails/events", data=text, headers=headers), 400, "body")
    assert "twice" in body["errors"]["body"][0]
    batch = b'{"events": [' + text + b"]}"
    assert_problem(client.post("/v1/queues/emails/events/batch", data=batch, headers=headers), 400, "body")
    assert written(raw) == (0, 0)


@pytest.fixture
def small_server(settings: Settings) -> Iterator[str]:
    """An app with a 4 KiB body limit behind a real HTTP server (it dechunks request bodies)."""
    app: Flask = create_app(dataclasses.replace(settings, max_body_bytes=4096), configure_logs=False)
    with serving_app(app) as url:
        yield url
    close_app(app)


def _post_chunked(base_url: str, token: str, body: bytes) -> tuple[int, str]:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    chunks = (body[i : i + 1000] for i in range(0, len(body), 1000))
    headers = {**auth(token), "Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    conn.request("POST", "/v1/queues/emails/events", body=chunks, encode_chunked=True, headers=headers)
    response = conn.getresponse()
    result = response.status, response.getheader("Content-Type", "")
    response.read()
    conn.close()
    return result


def test_chunked_body_over_the_limit_is_413(
    small_server: str, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    body = b'{"item_key": "k", "data": {"s": "' + b"x" * 10_000 + b'"}}'
    assert _post_chunked(small_server, token, body) == (413, "application/problem+json")
    assert written(raw) == (0, 0)


def test_chunked_body_within_the_limit_is_read_whole(small_server: str, emails: str, token: str) -> None:
    body = b'{"item_key": "k", "data": {"s": "' + b"x" * 3_000 + b'"}}'
    assert _post_chunked(small_server, token, body)[0] == 202
