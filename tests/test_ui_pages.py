"""The dashboard's pages of round 2 through Flask's test client: schedules, queue settings,
tokens, the queue page's count and pages, retry at a time, cancel with a reason.

The same pages in a real browser, as an admin and as a queue token: tests/test_ui_pages_browser.py.
"""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import schedule
from tests.test_ui import csrf_of, kill, sign_in
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store

NIGHTLY = {"cron": "0 3 * * *", "timezone": "Europe/Lisbon", "data": {"report": "daily"}}


def put_schedule(client: FlaskClient, token: str, key: str, queue: str = "emails", **fields: Any) -> None:
    response = client.put(f"/v1/queues/{queue}/schedules/{key}", json={**NIGHTLY, **fields}, headers=auth(token))
    assert response.status_code in (200, 201), response.json


def api_schedule(client: FlaskClient, token: str, key: str) -> dict[str, Any]:
    found: dict[str, Any] = client.get(f"/v1/queues/emails/schedules/{key}", headers=auth(token)).json
    return found


# -- schedules --------------------------------------------------------------------------------------


def test_schedules_page_lists_next_occurrences_and_pauses_resumes_and_deletes(
    client: FlaskClient, admin_token: str, token: str, emails: str
) -> None:
    put_schedule(client, admin_token, "nightly")
    put_schedule(client, admin_token, "weekly", cron="15 9 * * 1", timezone="UTC")
    sign_in(client, token)  # a queue token manages its queue's schedules, as through the API
    page = client.get("/ui/queues/emails/schedules")
    text = page.get_data(as_text=True)
    assert page.status_code == 200
    assert re.findall(r"<code>(nightly|weekly)</code>", text) == ["nightly", "weekly"]
    nexts = api_schedule(client, admin_token, "nightly")["next_occurrences"]
    assert len(nexts) == 5
    for at in nexts:  # all five, as the API lists them
        assert datetime.fromisoformat(at).strftime("%Y-%m-%d %H:%M:%SZ") in text
    assert "Europe/Lisbon" in text and "0 3 * * *" in text

    csrf = csrf_of(page)
    done = client.post("/ui/queues/emails/schedules/nightly/pause", data={"csrf_token": csrf}, follow_redirects=True)
    assert "Paused schedule nightly" in done.get_data(as_text=True)
    assert api_schedule(client, admin_token, "nightly")["paused"] is True
    client.post("/ui/queues/emails/schedules/nightly/resume", data={"csrf_token": csrf})
    assert api_schedule(client, admin_token, "nightly")["paused"] is False
    timeline = client.get("/v1/queues/emails/events/nightly/timeline", headers=auth(admin_token)).json["entries"]
    assert [(e["action"], e["actor"]) for e in timeline][-2:] == [
        ("schedule_updated", "signup-service"),
        ("schedule_updated", "signup-service"),
    ]
    client.post("/ui/queues/emails/schedules/weekly/delete", data={"csrf_token": csrf})
    assert client.get("/v1/queues/emails/schedules/weekly", headers=auth(admin_token)).status_code == 404
    gone = client.post("/ui/queues/emails/schedules/weekly/delete", data={"csrf_token": csrf}, follow_redirects=True)
    assert "Not deleted" in gone.get_data(as_text=True)  # reported, not a 500


def test_a_queue_token_cannot_reach_another_queues_schedules(
    client: FlaskClient, admin_token: str, token: str, emails: str
) -> None:
    client.put("/v1/queues/billing", json={}, headers=auth(admin_token))
    put_schedule(client, admin_token, "invoices", queue="billing")
    sign_in(client, token)
    csrf = csrf_of(client.get("/ui/queues/emails/schedules"))
    assert client.get("/ui/queues/billing/schedules").status_code == 404
    for action in ("pause", "delete"):
        response = client.post(f"/ui/queues/billing/schedules/invoices/{action}", data={"csrf_token": csrf})
        assert response.status_code == 404
    kept = client.get("/v1/queues/billing/schedules/invoices", headers=auth(admin_token)).json
    assert kept["paused"] is False


# -- settings ---------------------------------------------------------------------------------------


def test_settings_show_every_setting_and_never_the_secret(
    client: FlaskClient, admin_token: str, token: str, emails: str
) -> None:
    created = client.put(
        "/v1/queues/hooks",
        json={"delivery": {"mode": "webhook", "url": "https://example.com/hook"}, "max_attempts": 7},
        headers=auth(admin_token),
    ).json
    secret = created["signing_secret"]
    sign_in(client, admin_token)
    text = client.get("/ui/queues/hooks/settings").get_data(as_text=True)
    assert secret not in text
    queue = client.get("/v1/queues/hooks", headers=auth(admin_token)).json
    for path, value in (
        ("delivery.mode", "webhook"),
        ("delivery.url", "https://example.com/hook"),
        ("max_attempts", "7"),
        ("lease_seconds", str(queue["lease_seconds"])),
        ("backoff.multiplier", str(queue["backoff"]["multiplier"])),
        ("max_in_flight", str(queue["max_in_flight"])),
        ("rate_per_second", "none"),
    ):
        shown = re.search(rf'data-setting="{re.escape(path)}">(.*?)</td>', text, re.S)
        assert shown is not None, path
        assert re.sub(r"<[^>]+>", "", shown[1]).strip() == value, path
    assert 'name="setting:max_attempts"' in text  # an admin gets the form


def test_settings_are_read_only_for_a_queue_token(
    client: FlaskClient, admin_token: str, token: str, emails: str
) -> None:
    sign_in(client, token)
    page = client.get("/ui/queues/emails/settings")
    assert page.status_code == 200
    assert 'name="setting:' not in page.get_data(as_text=True)
    refused = client.post("/ui/queues/emails/settings", data={"csrf_token": csrf_of(page), "setting:max_attempts": "3"})
    assert refused.status_code == 403
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json["max_attempts"] != 3


def test_an_admin_edits_settings_as_the_api_would_and_gets_its_messages(
    client: FlaskClient, admin_token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/settings")
    form = {
        name: html.unescape(value)
        for name, value in re.findall(r'<input name="(setting:[^"]+)"[^>]*value="([^"]*)"', page.get_data(as_text=True))
    }
    form |= {"csrf_token": csrf_of(page), "setting:max_attempts": "4", "setting:rate_per_second": "12.5"}
    saved = client.post("/ui/queues/emails/settings", data=form)
    assert saved.status_code == 303
    queue = client.get("/v1/queues/emails", headers=auth(admin_token)).json
    assert (queue["max_attempts"], queue["rate_per_second"]) == (4, 12.5)

    before = raw.execute("SELECT updated_on FROM tickler_queue WHERE name = 'emails'").fetchone()
    bad = client.post(
        "/ui/queues/emails/settings",
        data={**form, "setting:max_attempts": "0", "setting:backoff.multiplier": "lots"},
    )
    assert bad.status_code == 400
    text = bad.get_data(as_text=True)
    assert "backoff.multiplier" in text and "A number." in text
    assert raw.execute("SELECT updated_on FROM tickler_queue WHERE name = 'emails'").fetchone() == before
    refused = client.post("/ui/queues/emails/settings", data={**form, "setting:max_attempts": "0"})
    assert refused.status_code == 400
    assert "max_attempts" in refused.get_data(as_text=True)  # the API's own message
    cleared = client.post("/ui/queues/emails/settings", data={**form, "setting:rate_per_second": ""})
    assert cleared.status_code == 303
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json["rate_per_second"] is None


# -- tokens -----------------------------------------------------------------------------------------


def test_an_admin_creates_a_token_shown_once_and_revokes_it(client: FlaskClient, admin_token: str, emails: str) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/tokens")
    assert page.status_code == 200
    created = client.post("/ui/tokens", data={"csrf_token": csrf_of(page), "name": "mailer", "queues": "emails"})
    assert created.status_code == 201
    new = re.search(r'<code class="token" id="new-token">([^<]+)</code>', created.get_data(as_text=True))
    assert new is not None
    token = new[1]
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 200
    listed = client.get("/ui/tokens").get_data(as_text=True)
    assert "mailer" in listed and token not in listed  # shown once: never again
    [token_id] = [
        t["id"] for t in client.get("/v1/tokens", headers=auth(admin_token)).json["tokens"] if t["name"] == "mailer"
    ]
    done = client.post(f"/ui/tokens/{token_id}/revoke", data={"csrf_token": csrf_of(page)}, follow_redirects=True)
    assert f"Revoked token {token_id}" in done.get_data(as_text=True)
    assert client.get("/v1/queues/emails", headers=auth(token)).status_code == 401
    bad = client.post("/ui/tokens", data={"csrf_token": csrf_of(page), "name": "", "queues": "Not A Queue"})
    assert bad.status_code == 400
    assert "queues" in bad.get_data(as_text=True)


def test_revoking_a_token_ends_its_dashboard_session(
    app: Any, client: FlaskClient, admin_token: str, store: Store
) -> None:
    other, info = store.tokens.issue("ops-2", is_admin=True)
    second = app.test_client()
    sign_in(second, other)
    assert second.get("/ui/").status_code == 200
    sign_in(client, admin_token)
    client.post(f"/ui/tokens/{info.id}/revoke", data={"csrf_token": csrf_of(client.get("/ui/tokens"))})
    assert second.get("/ui/").status_code == 302


def test_a_queue_token_cannot_reach_the_tokens_page(client: FlaskClient, token: str, emails: str) -> None:
    sign_in(client, token)
    page = client.get("/ui/")
    assert "/ui/tokens" not in page.get_data(as_text=True)
    assert client.get("/ui/tokens").status_code == 403
    refused = client.post("/ui/tokens", data={"csrf_token": csrf_of(page), "name": "x", "admin": "yes"})
    assert refused.status_code == 403
    assert client.post("/ui/tokens/1/revoke", data={"csrf_token": csrf_of(page)}).status_code == 403


# -- the queue page: total, previous page; retry at a time; cancel with a reason --------------------


def test_queue_page_counts_the_search_and_pages_back(client: FlaskClient, admin_token: str, emails: str) -> None:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    for i in range(120):
        schedule(client, admin_token, f"user:{i:03d}", schedule_on=(base + timedelta(minutes=i)).isoformat())
    sign_in(client, admin_token)
    first = client.get("/ui/queues/emails?item_key_prefix=user:&sort=due").get_data(as_text=True)
    assert "120 events match these filters" in first
    assert 'rel="prev"' not in first
    pages = [first]
    while (found := re.search(r'href="([^"]+)" rel="next"', pages[-1])) is not None:
        pages.append(client.get(html.unescape(found[1])).get_data(as_text=True))
    assert len(pages) == 3
    back = re.search(r'href="([^"]+)" rel="prev"', pages[2])
    assert back is not None
    previous = client.get(html.unescape(back[1])).get_data(as_text=True)
    assert re.findall(r"<code>(user:\d+)</code>", previous) == re.findall(r"<code>(user:\d+)</code>", pages[1])
    back = re.search(r'href="([^"]+)" rel="prev"', previous)
    assert back is not None
    assert re.findall(r"<code>(user:\d+)</code>", client.get(html.unescape(back[1])).get_data(as_text=True)) == [
        f"user:{i:03d}" for i in range(50)
    ]
    since = client.get("/ui/queues/emails?since=2030-01-01T01:00").get_data(as_text=True)
    assert "60 events match these filters" in since


def test_the_total_is_capped_and_says_so(
    client: FlaskClient, admin_token: str, emails: str, store: Store, monkeypatch: Any
) -> None:
    from tickler.api.ui import pages

    monkeypatch.setattr(pages, "COUNT_CAP", 20)
    events = [NewEvent(item_key=f"k{i}", data={}) for i in range(60)]  # more than a page
    store.events.schedule_batch(store.queues.get("emails"), events, actor="svc")
    sign_in(client, admin_token)
    text = client.get("/ui/queues/emails").get_data(as_text=True)
    assert "More than 20 events match" in text and "counting stops at 20" in text
    exact = client.get("/ui/queues/emails?item_key_prefix=k1").get_data(as_text=True)
    assert "11 events match these filters" in exact  # k1, k10…k19: one page, counted as listed


def test_retry_at_a_delay_or_a_time_and_cancel_with_a_reason(
    client: FlaskClient, admin_token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    for key in ("a", "b"):
        schedule(client, admin_token, key)
        kill(raw, key)
    schedule(client, admin_token, "c")
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/events/a")
    assert 'name="delay_seconds"' in page.get_data(as_text=True)
    csrf = csrf_of(page)
    done = client.post("/ui/queues/emails/events/a/retry", data={"csrf_token": csrf, "delay_seconds": "600"})
    assert done.status_code == 303
    event = client.get("/v1/queues/emails/events/a", headers=auth(admin_token)).json
    due = datetime.fromisoformat(event["schedule_on"]) - datetime.now(UTC)
    assert event["status"] == "pending" and timedelta(seconds=590) < due <= timedelta(seconds=600)
    at = client.post(
        "/ui/queues/emails/events/b/retry",
        data={"csrf_token": csrf, "schedule_on": "2031-02-03T04:05"},
        follow_redirects=True,
    )
    assert "Retried b: it is due at 2031-02-03 04:05:00Z" in at.get_data(as_text=True)
    assert client.get("/v1/queues/emails/events/b", headers=auth(admin_token)).json["schedule_on"] == (
        "2031-02-03T04:05:00Z"
    )
    refused = client.post(
        "/ui/queues/emails/events/b/retry", data={"csrf_token": csrf, "delay_seconds": "soon"}, follow_redirects=True
    )
    assert "Not retried" in refused.get_data(as_text=True)
    client.post("/ui/queues/emails/events/c/cancel", data={"csrf_token": csrf, "reason": "customer asked"})
    entry = client.get("/v1/queues/emails/events/c/timeline", headers=auth(admin_token)).json["entries"][-1]
    assert (entry["action"], entry["details"]["reason"]) == ("cancelled", "customer asked")


def test_the_pause_button_asks_first(client: FlaskClient, admin_token: str, emails: str) -> None:
    sign_in(client, admin_token)
    text = client.get("/ui/queues/emails").get_data(as_text=True)
    form = re.search(r'<form method="post" action="/ui/queues/emails/pause"[^>]*>', text)
    assert form is not None and 'data-confirm="Pause emails?' in form[0]


def test_an_admin_turns_a_pull_queue_into_a_webhook_queue(client: FlaskClient, admin_token: str, emails: str) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/settings")
    text = page.get_data(as_text=True)
    assert '<option value="webhook" >webhook</option>' in text  # the mode is a choice, from the schema
    form = {
        "csrf_token": csrf_of(page),
        "setting:delivery.mode": "webhook",
        "setting:delivery.url": "https://example.com/in",
    }
    assert client.post("/ui/queues/emails/settings", data=form).status_code == 303
    queue = client.get("/v1/queues/emails", headers=auth(admin_token)).json
    assert queue["delivery"]["mode"] == "webhook" and queue["delivery"]["url"] == "https://example.com/in"
    secret = client.get("/v1/queues/emails/signing-secret", headers=auth(admin_token)).json["signing_secret"]
    assert secret not in client.get("/ui/queues/emails/settings").get_data(as_text=True)
    no_url = client.post("/ui/queues/emails/settings", data={**form, "setting:delivery.url": ""})
    assert no_url.status_code == 400
    assert "delivery.url" in no_url.get_data(as_text=True)
