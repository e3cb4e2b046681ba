"""Admin token management: issue (shown once), list (never the secret), revoke."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
from flask.testing import FlaskClient

from tests.conftest import auth
from tickler.config import Settings
from tickler.scheduler.store import QueueSettings, Store


def test_issue_use_list_and_revoke(client: FlaskClient, admin_token: str, emails: str) -> None:
    issued = client.post("/v1/tokens", json={"name": "billing", "queues": ["emails"]}, headers=auth(admin_token))
    assert issued.status_code == 201
    token = issued.json["token"]
    assert token.startswith("tkl_") and issued.json["queues"] == ["emails"] and issued.json["admin"] is False
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 200

    listed = client.get("/v1/tokens", headers=auth(admin_token)).json["tokens"]
    assert {t["name"] for t in listed} == {"ops", "billing"}
    assert all("token" not in t for t in listed)

    revoked = client.delete(f"/v1/tokens/{issued.json['id']}", headers=auth(admin_token))
    assert revoked.status_code == 200 and revoked.json["revoked_on"] is not None
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 401


def test_only_admins_manage_tokens_and_bad_input_is_400(client: FlaskClient, admin_token: str, token: str) -> None:
    assert client.post("/v1/tokens", json={"name": "x"}, headers=auth(token)).status_code == 403
    assert client.get("/v1/tokens", headers=auth(token)).status_code == 403
    for body in (
        {},
        {"name": ""},
        {"name": "x", "queues": ["Bad Name"]},
        {"name": "x", "admin": "yes"},
        {"name": "x", "extra": 1},
    ):
        response = client.post("/v1/tokens", json=body, headers=auth(admin_token))
        assert response.status_code == 400, body
    assert client.delete("/v1/tokens/999", headers=auth(admin_token)).status_code == 404
    assert len(client.get("/v1/tokens", headers=auth(admin_token)).json["tokens"]) == 2  # nothing written


def test_cli_lists_and_revokes(
    store: object, database_url: str, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    env = {"TICKLER_DATABASE_URL": database_url, "TICKLER_LOG_LEVEL": "WARNING", "PATH": "/usr/bin:/bin"}

    def tickler(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tickler.cli", *args], env=env, capture_output=True, text=True)

    header, line = tickler("token", "list").stdout.splitlines()
    assert header.split() == ["ID", "NAME", "SCOPE", "CREATED", "LAST", "USED", "STATE"]
    token_id, name, scope, *_, last_used, state = line.split()
    assert (name, scope, last_used, state) == ("ops", "admin", "never", "active")
    [listed] = json.loads(tickler("token", "list", "--json").stdout)
    assert listed["id"] == int(token_id) and listed["admin"] is True and listed["revoked_on"] is None
    assert listed["last_used_at"] is None
    # what the API records of a use (api/token_use.py, at most once a minute), the list shows
    raw.execute("UPDATE tickler_token SET last_used_on = '2026-11-27 08:30:00+00' WHERE id = %s", [int(token_id)])
    [listed] = json.loads(tickler("token", "list", "--json").stdout)
    assert listed["last_used_at"] == "2026-11-27T08:30:00Z"
    assert "2026-11-27 08:30" in tickler("token", "list").stdout
    revoked = tickler("token", "revoke", token_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    again = tickler("token", "revoke", token_id)
    assert again.returncode == 1
    assert "already revoked" in again.stderr and again.stdout == ""
    assert tickler("token", "revoke", "4242").returncode == 1


def test_cli_warns_of_a_token_for_a_queue_that_does_not_exist(store: Store, database_url: str) -> None:
    env = {"TICKLER_DATABASE_URL": database_url, "TICKLER_LOG_LEVEL": "WARNING", "PATH": "/usr/bin:/bin"}
    store.queues.put("emails", QueueSettings(), Settings())
    created = subprocess.run(
        [sys.executable, "-m", "tickler.cli", "token", "create", "svc", "--queue", "emails", "--queue", "emials"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    [token] = created.stdout.split()  # only the token on stdout
    assert token.startswith("tkl_")
    assert "no queue named 'emials'" in created.stderr
    assert "'emails'" not in created.stderr
