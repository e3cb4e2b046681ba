"""The dashboard through Flask's test client: sign-in, sessions, CSRF, tenants, pages and buttons.

The same flows run in a real browser in tests/test_ui_browser.py; these pin the HTTP details a
browser hides (status codes, cookie attributes, headers).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import psycopg
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.conftest import auth
from tests.helpers import schedule
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.store import Store

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(response: TestResponse) -> str:
    found = _CSRF.search(response.get_data(as_text=True))
    assert found, "no CSRF token on the page"
    return found[1]


def sign_in(client: FlaskClient, token: str) -> TestResponse:
    page = client.get("/ui/sign-in")
    return client.post("/ui/sign-in", data={"token": token, "csrf_token": csrf_of(page)})


def kill(raw: psycopg.Connection[Any], item_key: str, queue: str = "emails") -> None:
    """Finish the open event of `item_key` as dead (as if its attempts ran out)."""
    done = raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w', outcome = 'dead',"
        " last_error = 'HTTP 500 from receiver' WHERE queue = %s AND item_key = %s AND dequeued_on IS NULL",
        [queue, item_key],
    )
    assert done.rowcount == 1


def test_pages_need_sign_in(client: FlaskClient) -> None:
    for path in ("/ui/", "/ui/leases", "/ui/queues/emails", "/ui/queues/emails/events/k"):
        response = client.get(path)
        assert response.status_code == 302
        assert response.headers["Location"].startswith("/ui/sign-in?next=")


def test_sign_in_sets_a_strict_httponly_cookie_without_the_token(client: FlaskClient, admin_token: str) -> None:
    response = sign_in(client, admin_token)
    assert response.status_code == 303
    assert response.headers["Location"] == "/ui/"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Path=/ui" in cookie
    assert admin_token not in cookie
    assert admin_token not in response.headers["Location"]
    assert client.get("/ui/").status_code == 200


def test_a_bad_token_is_refused(client: FlaskClient) -> None:
    response = sign_in(client, "tk_not-a-token")
    assert response.status_code == 401
    assert "not valid" in response.get_data(as_text=True)
    assert client.get("/ui/").status_code == 302


def test_sign_in_goes_back_to_the_page_asked_for_but_never_elsewhere(client: FlaskClient, admin_token: str) -> None:
    for asked, lands in (("/ui/leases", "/ui/leases"), ("https://evil.example/ui/", "/ui/"), ("//evil/ui/", "/ui/")):
        page = client.get("/ui/sign-in")
        response = client.post("/ui/sign-in", data={"token": admin_token, "csrf_token": csrf_of(page), "next": asked})
        assert response.headers["Location"] == lands
        client.post("/ui/sign-out", data={"csrf_token": csrf_of(client.get("/ui/leases"))})


def test_a_form_without_its_csrf_token_is_refused(client: FlaskClient, admin_token: str, emails: str) -> None:
    client.get("/ui/sign-in")
    refused = client.post("/ui/sign-in", data={"token": admin_token})
    assert refused.status_code == 400
    assert sign_in(client, admin_token).status_code == 303
    schedule(client, admin_token, "k1")
    for data in ({}, {"csrf_token": "forged"}):
        response = client.post("/ui/queues/emails/events/k1/cancel", data=data)
        assert response.status_code == 400
        assert "security token" in response.get_data(as_text=True)
    assert client.get("/v1/queues/emails/events/k1", headers=auth(admin_token)).json["status"] == "pending"
    # The sign-out form too: without its token the session stays.
    assert client.post("/ui/sign-out", data={}).status_code == 400
    assert client.get("/ui/").status_code == 200


def test_sign_out_ends_the_session(client: FlaskClient, admin_token: str) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/")
    response = client.post("/ui/sign-out", data={"csrf_token": csrf_of(page)})
    assert response.status_code == 303
    assert client.get("/ui/").status_code == 302


def test_a_revoked_token_signs_its_session_out(client: FlaskClient, admin_token: str, store: Store) -> None:
    other, info = store.tokens.issue("ops-2", is_admin=True)
    sign_in(client, other)
    assert client.get("/ui/").status_code == 200
    store.tokens.revoke(info.id)
    assert client.get("/ui/").status_code == 302  # the test app caches principals for 0 s


def test_a_queue_token_sees_only_its_queues(
    client: FlaskClient, admin_token: str, token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    client.put("/v1/queues/billing", json={}, headers=auth(admin_token))
    schedule(client, admin_token, "invoice:1", queue="billing")
    sign_in(client, token)
    overview = client.get("/ui/").get_data(as_text=True)
    assert "/ui/queues/emails" in overview
    assert "billing" not in overview
    for path in ("/ui/queues/billing", "/ui/queues/billing/events/invoice:1", "/ui/queues/nope"):
        response = client.get(path)
        assert response.status_code == 404, path
    # The same 404 for a queue that exists and one that does not: nothing tells them apart.
    assert client.get("/ui/queues/billing").get_data() == client.get("/ui/queues/nope").get_data().replace(
        b"nope", b"billing"
    )
    page = client.get("/ui/queues/emails")
    response = client.post("/ui/queues/billing/events/invoice:1/cancel", data={"csrf_token": csrf_of(page)})
    assert response.status_code == 404
    assert client.get("/v1/queues/billing/events/invoice:1", headers=auth(admin_token)).json["status"] == "pending"


def test_overview_shows_counts_oldest_due_and_rates(
    client: FlaskClient, admin_token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=3)).isoformat()
    schedule(client, admin_token, "due:1", schedule_on=past)
    schedule(client, admin_token, "later:1", delay_seconds=3600)
    schedule(client, admin_token, "dead:1")
    kill(raw, "dead:1")
    schedule(client, admin_token, "sent:1", delay_seconds=0)
    claimed = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 1}, headers=auth(admin_token))
    [lease] = claimed.json["leases"]
    assert lease["events"][0]["item_key"] == "due:1"  # the oldest due first
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(admin_token)).status_code == 200
    sign_in(client, admin_token)
    html = client.get("/ui/").get_data(as_text=True)
    row = html[html.index("/ui/queues/emails") :]
    numbers = re.findall(r'<td class="num[^"]*">(?:<a [^>]*>)?([^<]*)(?:</a>)?</td>', row)
    # pending, due, in flight, dead, delivered, cancelled, oldest due (sent:1, due just now)
    assert numbers[:6] == ["2", "1", "0", "1", "1", "0"]
    assert numbers[6].endswith("s")
    assert "1 delivered in the last hour, peak 1 a minute" in row
    assert "0 failed attempts in the last hour" in row


def test_queue_page_searches_and_pages(client: FlaskClient, admin_token: str, emails: str) -> None:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    for i in range(60):
        when = (base + timedelta(minutes=i)).isoformat()
        schedule(client, admin_token, f"user:{i:02d}", schedule_on=when, group_key="g" if i % 2 else None)
    schedule(client, admin_token, "other:1", schedule_on=base.isoformat())
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails?item_key_prefix=user:&sort=due").get_data(as_text=True)
    keys = re.findall(r"<code>(user:\d\d)</code>", page)
    assert keys == [f"user:{i:02d}" for i in range(50)]
    next_url = re.search(r'href="([^"]+)" rel="next"', page)
    assert next_url is not None
    rest = client.get(next_url[1].replace("&amp;", "&")).get_data(as_text=True)
    assert re.findall(r"<code>(user:\d\d)</code>", rest) == [f"user:{i:02d}" for i in range(50, 60)]
    grouped = client.get("/ui/queues/emails?group_key=g&since=2030-01-01T00:50&sort=due").get_data(as_text=True)
    assert re.findall(r"<code>(user:\d\d)</code>", grouped) == [f"user:{i}" for i in range(51, 60, 2)]
    bad = client.get("/ui/queues/emails?status=lost&since=yesterday")
    assert bad.status_code == 400
    assert "Not a status" in bad.get_data(as_text=True)


def test_key_page_shows_the_timeline_across_reuses(
    client: FlaskClient, admin_token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    key = "welcome:ana@example.com"
    schedule(client, admin_token, key)
    kill(raw, key)
    schedule(client, admin_token, key, data={"n": 2})
    sign_in(client, admin_token)
    found = client.get(f"/ui/queues/emails/find?item_key={quote(key)}")
    assert found.status_code == 302
    page = client.get(found.headers["Location"]).get_data(as_text=True)
    assert page.count('class="occurrence"') == 2
    assert page.index("Event 2") < page.index("Event 1")  # latest use first
    assert "tl-enqueued" in page
    assert client.get("/ui/queues/emails/events/never-seen").status_code == 404


def test_cancel_buttons(client: FlaskClient, admin_token: str, emails: str) -> None:
    for key in ("a:1", "a:2", "b:1"):
        schedule(client, admin_token, key)
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails")
    csrf = csrf_of(page)
    response = client.post("/ui/queues/emails/events/b:1/cancel", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert client.get("/v1/queues/emails/events/b:1", headers=auth(admin_token)).json["status"] == "cancelled"
    entry = client.get("/v1/queues/emails/events/b:1/timeline", headers=auth(admin_token)).json["entries"][-1]
    assert entry["actor"] == "ops"
    refused = client.post("/ui/queues/emails/events/cancel", data={"csrf_token": csrf}, follow_redirects=True)
    assert "refused" in refused.get_data(as_text=True)
    done = client.post(
        "/ui/queues/emails/events/cancel", data={"csrf_token": csrf, "item_key_prefix": "a:"}, follow_redirects=True
    )
    assert "Cancelled 2 pending events" in done.get_data(as_text=True)


def test_pages_carry_security_headers(client: FlaskClient, admin_token: str) -> None:
    sign_in(client, admin_token)
    response = client.get("/ui/")
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    css = client.get("/ui/static/style.css")
    assert css.status_code == 200
    assert b"--ink" in css.get_data()
    css.close()


def test_processes_share_the_session_key_kept_in_the_database(
    settings: Settings, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    """Without TICKLER_SECRET_KEY, the first process makes the key; a session signed by one
    process (a gunicorn worker) is valid in another. Each app's very first request signs in."""
    first, second = (create_app(settings, configure_logs=False) for _ in range(2))
    try:
        one = first.test_client()
        assert sign_in(one, admin_token).status_code == 303
        stored = raw.execute("SELECT secret FROM tickler_ui_secret").fetchall()
        assert len(stored) == 1
        assert first.secret_key == stored[0][0]
        cookie = one.get_cookie("tickler_ui", path="/ui")
        assert cookie is not None
        two = second.test_client()
        two.set_cookie("tickler_ui", cookie.value, path="/ui")
        assert two.get("/ui/").status_code == 200
        assert second.secret_key == first.secret_key
    finally:
        for app in (first, second):
            close_app(app)


def test_a_secret_key_setting_is_used_as_given(settings: Settings, admin_token: str) -> None:
    app = create_app(settings.with_overrides(secret_key="k" * 40, secure_cookies=True), configure_logs=False)
    try:
        response = sign_in(app.test_client(), admin_token)
        assert app.secret_key == "k" * 40
        assert "Secure" in response.headers["Set-Cookie"]
    finally:
        close_app(app)


def test_retry_buttons_single_and_by_filter(
    client: FlaskClient, admin_token: str, token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    for key in ("a:1", "a:2", "b:1", "a:open"):
        schedule(client, admin_token, key)
    for key in ("a:1", "a:2", "b:1"):
        kill(raw, key)
    sign_in(client, token)  # a queue token may retry in its own queue
    csrf = csrf_of(client.get("/ui/queues/emails"))
    done = client.post("/ui/queues/emails/events/b:1/retry", data={"csrf_token": csrf}, follow_redirects=True)
    assert "Retried b:1" in done.get_data(as_text=True)
    assert client.get("/v1/queues/emails/events/b:1", headers=auth(admin_token)).json["status"] == "pending"
    entry = client.get("/v1/queues/emails/events/b:1/timeline", headers=auth(admin_token)).json["entries"][-1]
    assert (entry["action"], entry["actor"]) == ("retried", "signup-service")
    again = client.post("/ui/queues/emails/events/b:1/retry", data={"csrf_token": csrf}, follow_redirects=True)
    assert "Not retried" in again.get_data(as_text=True)  # already open: reported, not a 500
    bulk = client.post(
        "/ui/queues/emails/events/retry", data={"csrf_token": csrf, "item_key_prefix": "a:"}, follow_redirects=True
    )
    assert "Retried 2 dead events" in bulk.get_data(as_text=True)
    everything = client.post("/ui/queues/emails/events/retry", data={"csrf_token": csrf}, follow_redirects=True)
    assert "refused" in everything.get_data(as_text=True)


def test_pause_and_resume_need_an_admin(client: FlaskClient, admin_token: str, token: str, emails: str) -> None:
    sign_in(client, token)
    page = client.get("/ui/queues/emails")
    assert "/ui/queues/emails/pause" not in page.get_data(as_text=True)  # no button for a client token
    assert client.post("/ui/queues/emails/pause", data={"csrf_token": csrf_of(page)}).status_code == 403
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json["paused"] is False
    client.post("/ui/sign-out", data={"csrf_token": csrf_of(page)})
    sign_in(client, admin_token)
    csrf = csrf_of(client.get("/ui/queues/emails"))
    assert client.post("/ui/queues/emails/pause", data={"csrf_token": csrf}).status_code == 303
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json["paused"] is True
    assert "badge-paused" in client.get("/ui/queues/emails").get_data(as_text=True)
    assert client.post("/ui/queues/emails/resume", data={"csrf_token": csrf}).status_code == 303
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json["paused"] is False
