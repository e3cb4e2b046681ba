"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against the
app behind a real local HTTP server.

Skipped, saying why, only where no Chromium can be found (CI installs it: .ci/run). With
TICKLER_UI_SCREENSHOTS=<dir> the tests also save a screenshot of every page there
(`make screenshots` refreshes docs/images/).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from tests import ui_demo
from tests.ui_browser import browser, demo, dialogs, follow, needs_chromium, page, playwright_sync, shot, sign_in
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store
from tickler.scheduler.store.dashboard import DashboardStore

pytestmark = needs_chromium
__all__ = ["browser", "demo", "dialogs", "page"]  # fixtures, shared with the other browser tests


def test_sign_in_find_a_key_read_its_timeline_and_retry_it(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store
) -> None:
    sign_in(page, live_server, admin_token)
    rows = page.locator("table.overview tbody tr")
    assert rows.count() == 3
    assert "paused" in rows.filter(has_text="reports").inner_text()
    assert page.locator("svg.chart-ok rect").count() > 0  # the last hour's deliveries, drawn
    shot(page, "queues")

    page.click("a:text-is('emails')")
    page.wait_for_url(f"{live_server}/ui/queues/emails")
    page.select_option("select[name=status]", "dead")
    page.click("button:has-text('Search')")
    # The search is a page load: wait for the new page, not the one the click left (count() does
    # not wait, and once saw the results page committed but not yet parsed).
    page.wait_for_url(re.compile(r".*/ui/queues/emails\?status=dead.*"), wait_until="load")
    assert page.locator("table.events tbody tr").filter(has_text=ui_demo.STORY_KEY).count() == 1
    shot(page, "queue")

    page.fill("#find-key", ui_demo.STORY_KEY)
    page.click("button:has-text('Open')")
    page.wait_for_url(f"{live_server}/ui/queues/emails/events/{quote(ui_demo.STORY_KEY, safe=':@')}")
    actions = page.locator("ol.timeline .tl-action").all_inner_texts()
    assert actions == ["dead", "claimed", "failed", "claimed", "failed", "claimed", "enqueued"]  # newest first
    timeline = page.locator("ol.timeline").inner_text()
    assert "HTTP 500 from https://hooks.example/mail" in timeline
    assert "worker-2" in timeline
    assert "attempt" in timeline
    # The data as sent, readable: no \u0027 or \u003c escapes.
    assert '"to": "Ana O\'Neil <ana@example.com>"' in page.locator("pre.data").inner_text()
    shot(page, "key")

    page.click("form.act button:has-text('Retry')")
    assert "Retried" in page.locator(".flash-ok").inner_text()
    assert page.locator(".event-head .status").inner_text() == "pending"
    assert page.locator("ol.timeline .tl-action").all_inner_texts()[0] == "retried"
    assert store.events.get("emails", ui_demo.STORY_KEY).status == "pending"


def test_the_overview_refreshes_itself(
    page: Any, live_server: str, admin_token: str, store: Store, make_queue: Any
) -> None:
    queue = make_queue("emails")
    sign_in(page, live_server, admin_token)
    page.goto(f"{live_server}/ui/?refresh=2")
    pending = page.locator("table.overview tbody tr td.num").first
    assert pending.inner_text() == "0"
    store.events.schedule(queue, NewEvent(item_key="new:1", data={}), actor="svc")
    # The page is not reloaded: the script swaps the table in place (within a few seconds).
    playwright_sync.expect(pending).to_have_text("1", timeout=8_000)
    assert page.locator("#live").get_attribute("data-refreshed-at") is not None


def test_pause_and_resume_a_queue(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store, dialogs: list[str]
) -> None:
    sign_in(page, live_server, admin_token, then="/ui/queues/emails")
    page.click("button:text-is('Pause')")
    # The page the click left has a badge too: wait for the new one's text, not the first read.
    playwright_sync.expect(page.locator("h1 .badge")).to_have_text("paused")
    assert dialogs[0].startswith("Pause emails?")  # it asked first
    assert _paused(store, "emails")
    page.click("button:text-is('Resume')")
    playwright_sync.expect(page.locator("h1 .badge")).to_have_text("running")
    assert not _paused(store, "emails")


def _paused(store: Store, queue: str) -> bool:
    [overview] = DashboardStore(store.engine).overview([queue])
    return overview.paused


def test_leases_page_lists_live_leases(page: Any, live_server: str, admin_token: str, demo: dict[str, Any]) -> None:
    sign_in(page, live_server, admin_token)
    follow(page, "a:text-is('Leases in flight')")
    table = page.locator("table").inner_text()
    assert "group acct-42 · 3 events" in table  # the group's due events under one lease
    assert "receipt:3" in table and "receipt:4" in table
    assert "worker-7" in table
    shot(page, "leases")


def test_a_queue_token_cannot_see_another_tenants_queue(
    page: Any, live_server: str, store: Store, demo: dict[str, Any]
) -> None:
    token = store.tokens.create("billing-service", queues=["billing"])
    sign_in(page, live_server, token)
    assert page.locator("table.overview tbody tr").all_inner_texts()[0].startswith("billing")
    assert page.locator("table.overview tbody tr").count() == 1
    response = page.goto(f"{live_server}/ui/queues/emails")
    assert response.status == 404
    response = page.goto(f"{live_server}/ui/queues/emails/events/{quote(ui_demo.STORY_KEY)}")
    assert response.status == 404
    assert "Not found" in page.locator("h1").inner_text()


def test_a_form_without_its_csrf_token_is_refused_and_sign_out_ends_the_session(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store
) -> None:
    sign_in(page, live_server, admin_token, then="/ui/queues/emails")
    # Take the token out of the Pause form, as a forged cross-site form would lack it.
    page.evaluate("document.querySelector(\"form[action$='/pause'] input[name=csrf_token]\").remove()")
    with page.expect_navigation():
        page.click("button:text-is('Pause')")
    assert "400" in page.locator("h1").inner_text()
    assert "security token" in page.locator("main").inner_text()
    assert not _paused(store, "emails")

    page.goto(f"{live_server}/ui/")
    page.click("button:has-text('Sign out')")
    page.wait_for_url(f"{live_server}/ui/sign-in")
    page.goto(f"{live_server}/ui/queues/emails")
    assert "/ui/sign-in" in page.url
    cookies = page.context.cookies()
    assert all(admin_token not in c["value"] for c in cookies)
