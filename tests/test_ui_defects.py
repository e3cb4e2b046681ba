"""Defects found walking the dashboard (issue #19), each pinned by the HTTP answer that showed it.

Through Flask's test client, like tests/test_ui.py; the browser-side ones also run in a real
Chromium in tests/test_ui_pages_browser.py.
"""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import schedule
from tests.test_ui import csrf_of, sign_in
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store

# -- 1. signing out ends the session on the server; a session has a fixed end ----------------------


def test_a_copied_cookie_stops_working_at_sign_out(
    app: Any, client: FlaskClient, admin_token: str, emails: str
) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails")
    csrf = csrf_of(page)
    cookie = client.get_cookie("tickler_ui", path="/ui")
    assert cookie is not None
    assert client.post("/ui/sign-out", data={"csrf_token": csrf}).status_code == 303

    thief = app.test_client()
    thief.set_cookie("tickler_ui", cookie.value, path="/ui")
    assert thief.get("/ui/").status_code == 302  # to the sign-in page
    refused = thief.post("/ui/queues/emails/pause", data={"csrf_token": csrf})
    assert refused.status_code == 303
    assert refused.headers["Location"].startswith("/ui/sign-in")
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json["paused"] is False


def test_activity_does_not_extend_a_session(
    client: FlaskClient, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    signed = sign_in(client, admin_token)
    first = client.get_cookie("tickler_ui", path="/ui")
    assert first is not None and first.expires is not None
    ends = first.expires
    assert timedelta(hours=11, minutes=59) < ends - datetime.now(UTC) <= timedelta(hours=12)
    assert "Set-Cookie" in signed.headers
    for path in ("/ui/", "/ui/leases", "/ui/"):
        response = client.get(path)
        assert response.status_code == 200
        assert "Set-Cookie" not in response.headers  # not renewed on use
    # The server's end is the one that counts: once it is reached, the cookie signs nobody in.
    raw.execute(
        "UPDATE tickler_ui_session SET created_on = now() - interval '13 hours', expires_on = now() - interval '1 hour'"
    )
    assert client.get("/ui/").status_code == 302


# -- 2. CR/LF in a redirect target --------------------------------------------------------------------


def test_a_next_or_back_with_cr_lf_falls_back_to_a_safe_page(
    client: FlaskClient, admin_token: str, emails: str
) -> None:
    page = client.get("/ui/sign-in?next=/ui/%0d%0aX:1")
    assert page.status_code == 200
    signed = client.post(
        "/ui/sign-in", data={"token": admin_token, "csrf_token": csrf_of(page), "next": "/ui/\r\nX: 1"}
    )
    assert signed.status_code == 303
    assert signed.headers["Location"] == "/ui/"
    again = client.get("/ui/sign-in?next=/ui/%0d%0aX:1")  # signed in: straight on, safely
    assert again.status_code == 302
    assert again.headers["Location"] == "/ui/"
    schedule(client, admin_token, "k1")
    csrf = csrf_of(client.get("/ui/queues/emails"))
    for back in (
        "/ui/queues/emails\r\nX: 1",
        "/ui/queues/emails\nX:1",
        "/ui/queues/emails\t",
        "/ui/queues/emails//x",
        "/ui/queues/emails-2",
    ):
        schedule(client, admin_token, "k1")
        done = client.post("/ui/queues/emails/events/k1/cancel", data={"csrf_token": csrf, "back": back})
        assert done.status_code == 303, back
        assert done.headers["Location"] == "/ui/queues/emails"
        assert client.get("/v1/queues/emails/events/k1", headers=auth(admin_token)).json["status"] == "cancelled"


# -- 3. bulk actions act on exactly the page's filters, and count first ------------------------------


@pytest.fixture
def fg_events(client: FlaskClient, admin_token: str, emails: str) -> None:
    """Pending events fg:1, fg:2 and fg:3 in emails, and other:1 beside them; the admin signed in."""
    for key in ("fg:1", "fg:2", "fg:3", "other:1"):
        schedule(client, admin_token, key)
    sign_in(client, admin_token)


@pytest.mark.usefixtures("fg_events")
def test_bulk_cancel_never_acts_beyond_the_filters_the_page_shows(client: FlaskClient, admin_token: str) -> None:
    shown = {"status": "dead", "item_key_prefix": "fg:", "since": "2099-01-01T00:00"}
    listed = client.get("/ui/queues/emails?status=dead&item_key_prefix=fg:&since=2099-01-01T00:00")
    assert "No events match." in listed.get_data(as_text=True)
    confirm = client.get("/ui/queues/emails/events/cancel?status=dead&item_key_prefix=fg:&since=2099-01-01T00:00")
    assert confirm.status_code == 400
    assert "pending events only" in confirm.get_data(as_text=True)
    csrf = csrf_of(listed)
    done = client.post("/ui/queues/emails/events/cancel", data={"csrf_token": csrf, **shown}, follow_redirects=True)
    assert "Nothing changed" in done.get_data(as_text=True)
    for key in ("fg:1", "fg:2", "fg:3"):
        assert client.get(f"/v1/queues/emails/events/{key}", headers=auth(admin_token)).json["status"] == "pending"
    # A time filter cannot be applied by the bulk call: refused, saying so.
    dated = client.get("/ui/queues/emails/events/cancel?item_key_prefix=fg:&since=2020-01-01T00:00")
    assert "cannot apply" in dated.get_data(as_text=True)


@pytest.mark.usefixtures("fg_events")
def test_bulk_cancel_says_how_many_then_cancels_those_with_the_typed_reason(
    client: FlaskClient, admin_token: str
) -> None:
    confirm = client.get("/ui/queues/emails/events/cancel?status=pending&item_key_prefix=fg:")
    text = confirm.get_data(as_text=True)
    assert confirm.status_code == 200
    assert "3 pending events will be cancelled" in text
    assert client.get("/v1/queues/emails/events/fg:1", headers=auth(admin_token)).json["status"] == "pending"
    form = {"csrf_token": csrf_of(confirm), "status": "pending", "item_key_prefix": "fg:", "reason": "duplicate signup"}
    done = client.post("/ui/queues/emails/events/cancel", data=form, follow_redirects=True)
    assert "Cancelled 3 pending events" in done.get_data(as_text=True)
    assert client.get("/v1/queues/emails/events/other:1", headers=auth(admin_token)).json["status"] == "pending"
    entry = client.get("/v1/queues/emails/events/fg:2/timeline", headers=auth(admin_token)).json["entries"][-1]
    assert (entry["action"], entry["details"]["reason"]) == ("cancelled", "duplicate signup")


# -- 4. event data as readable JSON --------------------------------------------------------------------


def test_event_data_is_shown_as_readable_json(client: FlaskClient, admin_token: str, emails: str) -> None:
    data = {"to": "<tom@example.com>", "name": "O'Brien", "city": "Zürich", "tags": ["a&b"]}
    schedule(client, admin_token, "k1", data=data)
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/events/k1").get_data(as_text=True)
    found = re.search(r'<pre class="data">(.*?)</pre>', page, re.S)
    assert found is not None
    shown = html.unescape(found[1])
    assert "<" not in found[1]  # escaped for HTML by the template
    assert "\\u" not in shown  # not escaped for a <script> by the JSON encoder
    assert '"name": "O\'Brien"' in shown and '"to": "<tom@example.com>"' in shown and "Zürich" in shown
    assert json.loads(shown) == data
    assert shown == json.dumps(json.loads(shown), indent=2, ensure_ascii=False)  # pretty-printed
    stored = client.get("/v1/queues/emails/events/k1", headers=auth(admin_token)).json["data"]
    assert list(json.loads(shown)) == list(stored)  # the stored order, not re-sorted


# -- 5. timeline details in words, not Python reprs ---------------------------------------------------


def test_timeline_details_are_words_not_python_reprs(client: FlaskClient, admin_token: str, emails: str) -> None:
    url = "/v1/queues/emails/schedules/nightly"
    body = {"cron": "0 3 * * *", "timezone": "Europe/Lisbon", "data": {}}
    assert client.put(url, json=body, headers=auth(admin_token)).status_code == 201
    body = {**body, "cron": "30 4 * * *", "timezone": "UTC", "paused": True}
    assert client.put(url, json=body, headers=auth(admin_token)).status_code == 200
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/events/nightly").get_data(as_text=True)
    timeline = page[page.index('<ol class="timeline">') :]
    assert "[" not in timeline and "False" not in timeline and "True" not in timeline and "None" not in timeline
    assert "cron, timezone, paused" in timeline


# -- 6. a key's timeline is paged, newest first -------------------------------------------------------


def test_a_keys_timeline_is_paged_newest_first(
    client: FlaskClient, admin_token: str, emails: str, store: Store
) -> None:
    queue = store.queues.get("emails")
    start = datetime(2030, 1, 1, tzinfo=UTC)
    for i in range(230):
        event = NewEvent(item_key="busy", data={"n": i}, schedule_on=start + timedelta(seconds=i))
        store.events.schedule(queue, event, actor="svc", on_conflict="debounce")
    sign_in(client, admin_token)
    pages, url = [], "/ui/queues/emails/events/busy"
    while url:
        page = client.get(url).get_data(as_text=True)
        pages.append(re.findall(r'<span class="tl-action">([^<]+)</span>', page))
        older = re.search(r'href="([^"]+)" rel="next">Older entries', page)
        url = html.unescape(older[1]) if older else ""
    assert [len(p) for p in pages] == [100, 100, 30]
    everything = [action for p in pages for action in p]
    assert everything[0] == "debounced" and everything[-1] == "enqueued"  # newest first, to the first
    api = client.get("/v1/queues/emails/events/busy/timeline", headers=auth(admin_token)).json["entries"]
    assert everything == [e["action"] for e in reversed(api)]
    assert client.get("/ui/queues/emails/events/busy?before=x").status_code == 404


# -- 7. unknown /ui/ paths get the dashboard's own 404 page ----------------------------------------------


def test_unknown_dashboard_paths_get_its_html_404_page_with_its_headers(
    client: FlaskClient, admin_token: str, emails: str
) -> None:
    paths = ("/ui/nope", "/ui/queues/emails/events/k/extra", "/ui/static/nope.css", "/ui/queues/emails/x/y")
    for signed_in in (False, True):
        if signed_in:
            sign_in(client, admin_token)
        for path in paths:
            response = client.get(path)
            assert response.status_code == 404, path
            assert response.mimetype == "text/html", path
            assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
            assert response.headers["X-Frame-Options"] == "DENY"
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert "404" in response.get_data(as_text=True)
