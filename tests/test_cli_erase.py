"""`tickler erase` (SPEC §12) as a real process against a test database: it logs the erasure and
prints its id, or with --wait runs it to the end; a mistake is exit 2 with the field named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import key_url, schedule

ROOT = Path(__file__).resolve().parents[1]
EMAIL = "zqxcli@example.com"


def tickler(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    env |= {"TICKLER_DATABASE_URL": database_url, "TICKLER_MIGRATE_ON_START": "false", "TICKLER_LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable, "-m", "tickler.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_erase_waits_for_the_erasure_and_prints_what_it_changed(
    client: FlaskClient, emails: str, token: str, admin_token: str, database_url: str
) -> None:
    assert schedule(client, token, f"welcome:{EMAIL}", group_key=EMAIL, data={"to": EMAIL}).status_code == 202
    assert schedule(client, token, f"promo:{EMAIL}", delay_seconds=60).status_code == 202
    done = tickler(
        database_url,
        "erase",
        "--group-key",
        EMAIL,
        "--item-key",
        f"promo:{EMAIL}",
        "--reason",
        "asked",
        "--wait",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    erasure: dict[str, Any] = json.loads(done.stdout)
    assert erasure["status"] == "done" and erasure["counts"]["open_events"] == 2
    assert erasure["requested_by"].startswith("cli:")
    for item_key in (f"welcome:{EMAIL}", f"promo:{EMAIL}"):
        assert client.get(key_url(item_key), headers=auth(token)).status_code == 404
    # the API reads the same log
    logged = client.get(f"/v1/erasures/{erasure['id']}", headers=auth(admin_token)).json
    assert logged["status"] == "done" and logged["counts"] == erasure["counts"]


def test_erase_without_wait_prints_the_id_of_a_pending_erasure(
    emails: str, database_url: str, raw: psycopg.Connection[Any]
) -> None:
    done = tickler(database_url, "erase", "--item-key-prefix", "welcome:zqx", "--queue", "emails", "--reason", "r")
    assert done.returncode == 0, done.stderr
    erasure_id = int(done.stdout.strip())
    assert raw.execute("SELECT status, queues FROM tickler_erasure WHERE id = %s", [erasure_id]).fetchone() == (
        "pending",
        ["emails"],
    )


def test_erase_refuses_mistakes_naming_them_and_logs_nothing(
    emails: str, database_url: str, raw: psycopg.Connection[Any]
) -> None:
    for args, said in (
        (["--reason", "r"], "--group-key"),
        (["--item-key-prefix", "ab", "--reason", "r"], "item_key_prefix"),
        (["--group-key", "g", "--queue", "nope", "--reason", "r"], "queues"),
        (["--group-key", "g"], "--reason"),
        (["--item-key", "a/b", "--reason", "r"], "--item-key"),
    ):
        done = tickler(database_url, "erase", *args)
        assert done.returncode == 2, (args, done)
        assert said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert raw.execute("SELECT count(*) FROM tickler_erasure").fetchone() == (0,)
