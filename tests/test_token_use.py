"""Tokens: when each was last used (written at most once a minute per token and process), a
dashboard form that makes one token however often it is sent, revoking the token you are signed
in with, and no token for a queue that does not exist."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem
from tests.test_ui import csrf_of, sign_in
from tickler.api.context import Tickler
from tickler.api.token_use import TokenUse
from tickler.scheduler.store import Store
from tickler.scheduler.store.tokens import hash_token


def _last_used(raw: psycopg.Connection[Any], token: str) -> Any:
    row = raw.execute("SELECT last_used_on FROM tickler_token WHERE token_hash = %s", [hash_token(token)]).fetchone()
    assert row is not None
    return row[0]


def test_last_use_is_written_at_most_once_a_minute_per_token(store: Store, raw: psycopg.Connection[Any]) -> None:
    token = store.tokens.create("svc", queues=["emails"])
    other = store.tokens.create("svc-2", queues=["emails"])
    clock = [1000.0]
    use = TokenUse(store.tokens, clock=lambda: clock[0])
    assert _last_used(raw, token) is None
    use.used(hash_token(token))
    first = _last_used(raw, token)
    assert first is not None and _last_used(raw, other) is None
    raw.execute("UPDATE tickler_token SET last_used_on = last_used_on - interval '2 minutes'")  # as if long ago
    moved = _last_used(raw, token)
    clock[0] += 59  # within the minute: no write, whatever the database holds
    use.used(hash_token(token))
    assert _last_used(raw, token) == moved
    clock[0] += 2  # a minute passed: written again
    use.used(hash_token(token))
    assert _last_used(raw, token) > moved


def test_the_api_and_the_dashboard_show_when_a_token_was_last_used(
    app: Flask, client: FlaskClient, admin_token: str, token: str, emails: str
) -> None:
    listed = {t["name"]: t for t in client.get("/v1/tokens", headers=auth(admin_token)).json["tokens"]}
    assert listed["ops"]["last_used_at"] is not None  # this very call used it
    assert listed["signup-service"]["last_used_at"] is None
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 200
    listed = {t["name"]: t for t in client.get("/v1/tokens", headers=auth(admin_token)).json["tokens"]}
    assert listed["signup-service"]["last_used_at"] is not None
    ext: Tickler = app.extensions["tickler"]
    assert hash_token(token) in ext.token_use._written
    signed_only = client.post("/v1/tokens", json={"name": "person", "admin": True}, headers=auth(admin_token)).json
    sign_in(client, signed_only["token"])  # a sign-in is a use too
    page = client.get("/ui/tokens").get_data(as_text=True)
    assert "Last used" in page and "never" not in page


def test_a_token_form_sent_again_makes_no_second_token(
    client: FlaskClient, admin_token: str, emails: str, store: Store
) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/tokens")
    issue_key = re.search(r'name="issue_key" value="([^"]+)"', page.get_data(as_text=True))
    assert issue_key is not None
    form = {"csrf_token": csrf_of(page), "name": "mailer", "queues": "emails", "issue_key": issue_key[1]}
    created = client.post("/ui/tokens", data=form)
    assert created.status_code == 201
    token = re.search(r'id="new-token">([^<]+)<', created.get_data(as_text=True))
    assert token is not None
    again = client.post("/ui/tokens", data=form)  # the browser's reload of the answer
    text = again.get_data(as_text=True)
    assert again.status_code == 200 and "Already created" in text
    assert token[1] not in text and 'id="new-token"' not in text  # shown once
    assert [t.principal for t in store.tokens.list()].count("mailer") == 1
    fresh = re.search(r'name="issue_key" value="([^"]+)"', text)
    assert fresh is not None and fresh[1] != issue_key[1]  # the next form makes a new token


def test_a_token_for_a_queue_that_does_not_exist_is_refused(
    client: FlaskClient, admin_token: str, emails: str, store: Store
) -> None:
    refused = client.post("/v1/tokens", json={"name": "x", "queues": ["emails", "nope"]}, headers=auth(admin_token))
    body = assert_problem(refused, 400, "queues")
    assert "'nope'" in str(body["errors"]["queues"]) and "emails" not in str(body["errors"]["queues"])
    sign_in(client, admin_token)
    page = client.get("/ui/tokens")
    form = client.post("/ui/tokens", data={"csrf_token": csrf_of(page), "name": "x", "queues": "nope"})
    assert form.status_code == 400 and "No queue named &#39;nope&#39;" in form.get_data(as_text=True)
    assert [t.principal for t in store.tokens.list()] == ["ops"]  # nothing written


def test_revoking_your_own_token_signs_you_out_with_a_message(
    client: FlaskClient, admin_token: str, store: Store
) -> None:
    [mine] = [t for t in store.tokens.list() if t.principal == "ops"]
    other = store.tokens.create("other", queues=[])
    sign_in(client, admin_token)
    page = client.get("/ui/tokens")
    text = page.get_data(as_text=True)
    assert "the one you are signed in with" in text and "you are signed out" in text
    assert text.count("Revoke (yours)") == 1
    done = client.post(f"/ui/tokens/{mine.id}/revoke", data={"csrf_token": csrf_of(page)})
    assert done.status_code == 303 and done.headers["Location"].endswith("/ui/sign-in")
    landing = client.get("/ui/sign-in").get_data(as_text=True)
    assert f"You revoked token {mine.id}, the one you were signed in with" in landing
    assert client.get("/ui/").status_code == 302  # signed out
    assert store.tokens.authenticate(other) is not None
