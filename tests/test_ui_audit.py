"""The dashboard's Operations log page (admins only, with the API's filters and paging) and the
upcoming-load chart on a queue's page."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

from flask.testing import FlaskClient

from tests.conftest import auth
from tests.test_ui import sign_in
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store
from tickler.scheduler.store.audit import EntryFilter


def test_admins_read_the_log_with_filters_and_pages(client: FlaskClient, admin_token: str) -> None:
    for name in ("alpha", "beta"):
        client.put(f"/v1/queues/{name}", json={}, headers=auth(admin_token))
    client.post("/v1/queues/alpha/pause", headers=auth(admin_token))
    sign_in(client, admin_token)
    page = client.get("/ui/audit")
    text = html.unescape(page.get_data(as_text=True))
    assert page.status_code == 200
    assert 'href="/ui/audit"' in text  # the nav link
    assert text.index("<code>queue.paused</code>") < text.index("<code>queue.created</code>")  # newest first
    assert "<code>dashboard.signed_in</code>" in text
    only = html.unescape(client.get("/ui/audit?queue=beta").get_data(as_text=True))
    assert "<code>queue.created</code>" in only and "<code>queue.paused</code>" not in only
    bad = client.get("/ui/audit?since=yesterday&action=nope")
    assert bad.status_code == 400
    assert "since" in bad.get_data(as_text=True) and "action" in bad.get_data(as_text=True)


def test_the_log_page_pages_by_cursor(client: FlaskClient, admin_token: str) -> None:
    from tickler.api.ui import oplog

    for n in range(oplog.PAGE_SIZE + 5):
        client.put(f"/v1/queues/q{n}", json={}, headers=auth(admin_token))
    sign_in(client, admin_token)
    first = client.get("/ui/audit?action=queue.created").get_data(as_text=True)
    assert first.count("<code>queue.created</code>") == oplog.PAGE_SIZE
    older = html.unescape(first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0])
    second = client.get(older).get_data(as_text=True)
    assert second.count("<code>queue.created</code>") == 5


def test_the_log_page_is_for_admins(client: FlaskClient, token: str, emails: str) -> None:
    sign_in(client, token)
    assert client.get("/ui/audit").status_code == 403
    assert 'href="/ui/audit"' not in client.get("/ui/").get_data(as_text=True)


def test_a_queue_page_draws_its_upcoming_load(client: FlaskClient, token: str, emails: str, store: Store) -> None:
    now = datetime.now(UTC)
    queue = store.queues.get(emails)
    events = [NewEvent(item_key=f"k{h}", data={}, schedule_on=now + timedelta(hours=h, minutes=1)) for h in (1, 2, 30)]
    store.events.schedule_batch(queue, events, actor="t")
    sign_in(client, token)
    text = client.get("/ui/queues/emails").get_data(as_text=True)
    assert 'class="chart chart-upcoming"' in text
    assert "2 pending events falling due in the next 24 hours, 1 later" in text
    assert text.count("falling due</title></rect>") == 2


def test_the_dashboards_changes_are_entries_of_the_signed_in_admin(
    client: FlaskClient, admin_token: str, emails: str, store: Store
) -> None:
    from tests.test_ui import csrf_of

    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails")
    assert client.post("/ui/queues/emails/pause", data={"csrf_token": csrf_of(page)}).status_code == 303
    tokens = client.get("/ui/tokens")
    created = client.post("/ui/tokens", data={"csrf_token": csrf_of(tokens), "name": "mailer", "queues": "emails"})
    assert created.status_code == 201
    [mailer] = [t.id for t in store.tokens.list() if t.principal == "mailer"]
    client.post(f"/ui/tokens/{mailer}/revoke", data={"csrf_token": csrf_of(tokens)})
    entries = store.audit.page(EntryFilter(actor="ops"), limit=10)
    assert [e.action for e in entries][:3] == ["token.revoked", "token.created", "queue.paused"]
    assert entries[2].queue == "emails" and entries[0].after is not None and entries[0].after["name"] == "mailer"
