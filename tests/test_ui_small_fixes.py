"""Smaller dashboard fixes: serve's warning about cookies beyond loopback, every invalid setting
reported at once, a refused retry time kept in its form, schedules in their own time zone and no
future "last enqueued", the charts' scale, failed attempts named as such, a skip link and no
empty table header."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient
from structlog.testing import capture_logs

from tests.conftest import auth
from tests.helpers import schedule
from tests.test_ui import csrf_of, kill, sign_in
from tickler.api.ui.charts import per_minute_chart
from tickler.commands.serve import beyond_loopback, warn_of_plain_cookies
from tickler.config import Settings
from tickler.scheduler.store import ScheduleSpec, Store


@pytest.mark.parametrize(
    ("host", "secure", "warned"),
    [
        ("0.0.0.0", False, True),
        ("192.168.1.5", False, True),
        ("::", False, True),
        ("0.0.0.0", True, False),
        ("127.0.0.1", False, False),
        ("::1", False, False),
    ],
)
def test_serve_warns_when_it_listens_beyond_loopback_without_secure_cookies(
    host: str, secure: bool, warned: bool
) -> None:
    with capture_logs() as logs:
        warn_of_plain_cookies(Settings(secure_cookies=secure), host)
    found = [entry for entry in logs if entry["event"] == "dashboard cookies without Secure"]
    assert len(found) == (1 if warned else 0)
    if warned:
        assert found[0]["log_level"] == "warning" and "TICKLER_SECURE_COOKIES=true" in found[0]["detail"]
    assert beyond_loopback("localhost")  # a name is not taken for loopback


def test_settings_report_every_invalid_field_at_once(client: FlaskClient, admin_token: str, emails: str) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/settings")
    before = client.get("/v1/queues/emails", headers=auth(admin_token)).json
    form = {"csrf_token": csrf_of(page), "setting:lease_seconds": "soon", "setting:max_attempts": "0"}
    refused = client.post("/ui/queues/emails/settings", data=form)
    text = refused.get_data(as_text=True)
    assert refused.status_code == 400
    reported = dict(re.findall(r"<li><b>([a-z_.]+)</b>: ([^<]+)</li>", text))
    assert reported.keys() == {"lease_seconds", "max_attempts"}, reported
    assert reported["lease_seconds"] == "A number."  # did not parse; the schema refused the other
    assert client.get("/v1/queues/emails", headers=auth(admin_token)).json == before  # nothing written


def test_a_refused_retry_time_stays_in_its_form(
    client: FlaskClient, admin_token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, admin_token, "a")
    kill(raw, "a")
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails/events/a")
    back = client.post(
        "/ui/queues/emails/events/a/retry",
        data={"csrf_token": csrf_of(page), "schedule_on": "next tuesday", "back": "/ui/queues/emails/events/a"},
        follow_redirects=True,
    )
    text = back.get_data(as_text=True)
    assert "Not retried: the time is a UTC time" in text
    assert 'name="schedule_on" placeholder="2026-11-22T09:00" spellcheck="false" value="next tuesday"' in text
    again = client.get("/ui/queues/emails/events/a").get_data(as_text=True)
    assert 'value="next tuesday"' not in again  # shown once, to correct it
    assert client.get("/v1/queues/emails/events/a", headers=auth(admin_token)).json["status"] == "dead"


def test_schedules_show_their_own_zone_and_no_future_last_enqueued(
    client: FlaskClient, admin_token: str, emails: str, store: Store
) -> None:
    store.schedules.put("emails", "weekly", ScheduleSpec("0 8 * * 1", "Europe/Lisbon", {}), actor="ops")
    sign_in(client, admin_token)
    text = client.get("/ui/queues/emails/schedules").get_data(as_text=True)
    assert re.search(r'zone-time">· \d{4}-\d\d-\d\d 08:00 (WET|WEST)</span>', text) is not None
    cell = re.search(r'<td class="last-enqueued">(.*?)</td>', text, re.S)
    assert cell is not None
    shown = re.findall(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ)", cell[1])
    for when in shown:
        moment = datetime.strptime(when, "%Y-%m-%d %H:%M:%SZ").replace(tzinfo=UTC)
        assert moment <= datetime.now(UTC) or cell[1].strip().startswith('<span class="muted"'), cell[1]
    assert "next, due" in cell[1]  # its next occurrence waits ahead: said so, not as a past enqueue


def test_charts_carry_a_scale() -> None:
    values = [0] * 58 + [3, 12]
    drawn = str(per_minute_chart(values, now=datetime.now(UTC), label="delivered", kind="ok"))
    assert ">12/min</text>" in drawn and ">60 min ago</text>" in drawn and ">now</text>" in drawn
    assert 'class="scale"' in drawn
    empty = str(per_minute_chart([0] * 60, now=datetime.now(UTC), label="delivered", kind="ok"))
    assert "/min" not in empty and ">now</text>" in empty


def test_pages_have_a_skip_link_no_empty_header_and_name_failed_attempts(
    client: FlaskClient, admin_token: str, emails: str, store: Store
) -> None:
    schedule(client, admin_token, "a")
    store.schedules.put("emails", "weekly", ScheduleSpec("0 8 * * 1", "UTC", {}), actor="ops")
    sign_in(client, admin_token)
    for path in ("/ui/", "/ui/queues/emails", "/ui/queues/emails/schedules", "/ui/tokens", "/ui/leases"):
        text = client.get(path).get_data(as_text=True)
        assert '<a class="skip-link" href="#main">' in text and '<main id="main"' in text, path
        assert re.search(r"<th[^>]*>\s*</th>", text) is None, path
    queue_page = client.get("/ui/queues/emails").get_data(as_text=True)
    assert "Redeliveries" not in queue_page and "Failed attempts" in queue_page
