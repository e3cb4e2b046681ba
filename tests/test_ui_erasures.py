"""Erasures on the dashboard (SPEC §12): an admin erases a key from its page after a confirmation
that counts what will change; the list shows the erasure; others get neither."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa
from flask.testing import FlaskClient

from tests.helpers import key_url, schedule
from tests.test_ui import csrf_of, sign_in
from tickler.scheduler.erasing import Eraser, Hasher

KEY = "welcome:zqxui@example.com"


def test_an_admin_erases_a_key_after_seeing_what_it_changes(
    client: FlaskClient, emails: str, token: str, admin_token: str, engine: sa.Engine, raw: psycopg.Connection[Any]
) -> None:
    assert schedule(client, token, KEY, delay_seconds=60).status_code == 202
    sign_in(client, admin_token)
    key_page = client.get(f"/ui{key_url(KEY)[3:]}").get_data(as_text=True)
    assert "Erase this key" in key_page
    confirm = client.get(f"/ui{key_url(KEY, suffix='/erase')[3:]}")
    assert confirm.status_code == 200
    text = confirm.get_data(as_text=True)
    assert "1 open event will be cancelled, 0 finished events and 1 timeline entry rewritten" in " ".join(text.split())
    # no reason: refused on the same page, nothing logged
    refused = client.post(f"/ui{key_url(KEY, suffix='/erase')[3:]}", data={"csrf_token": csrf_of(confirm)})
    assert refused.status_code == 400 and "Give a reason" in refused.get_data(as_text=True)
    assert raw.execute("SELECT count(*) FROM tickler_erasure").fetchone() == (0,)
    done = client.post(
        f"/ui{key_url(KEY, suffix='/erase')[3:]}", data={"csrf_token": csrf_of(confirm), "reason": "ticket 1"}
    )
    assert done.status_code == 303 and done.headers["Location"].endswith("/ui/erasures")
    Eraser(engine, Hasher(engine)).run_unfinished()
    listing = client.get("/ui/erasures").get_data(as_text=True)
    assert "ticket 1" in listing and "done" in listing and "zqxui" not in listing
    assert raw.execute("SELECT count(*) FROM tickler_event_all WHERE item_key = %s", [KEY]).fetchone() == (0,)


def test_erasing_from_the_dashboard_needs_an_admin_and_a_csrf_token(
    client: FlaskClient, emails: str, token: str, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    assert schedule(client, token, KEY, delay_seconds=60).status_code == 202
    sign_in(client, token)
    assert "Erase this key" not in client.get(f"/ui{key_url(KEY)[3:]}").get_data(as_text=True)
    assert client.get(f"/ui{key_url(KEY, suffix='/erase')[3:]}").status_code == 403
    assert client.get("/ui/erasures").status_code == 403
    admin = client.application.test_client()
    sign_in(admin, admin_token)
    no_csrf = admin.post(f"/ui{key_url(KEY, suffix='/erase')[3:]}", data={"reason": "r"})
    assert no_csrf.status_code == 400
    assert raw.execute("SELECT count(*) FROM tickler_erasure").fetchone() == (0,)
