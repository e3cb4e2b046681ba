"""The dashboard's round-2 pages and fixes in a real browser (headless Chromium, Playwright),
as an admin and as a queue token: schedules, settings, tokens, the queue page's charts, refresh
and pages, bulk actions that count first, and a sign-out that a copied cookie does not survive.

With TICKLER_UI_SCREENSHOTS=<dir> the tests save a screenshot of each page (`make screenshots`).
"""

from __future__ import annotations

import re
from typing import Any

from tests.ui_browser import browser, demo, dialogs, follow, needs_chromium, page, playwright_sync, shot, sign_in
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store

pytestmark = needs_chromium
__all__ = ["browser", "demo", "dialogs", "page"]  # fixtures, shared with the other browser tests

expect = playwright_sync.expect


def test_a_copied_cookie_does_not_outlive_sign_out(
    browser: Any, page: Any, live_server: str, admin_token: str, demo: dict[str, Any]
) -> None:
    sign_in(page, live_server, admin_token)
    copy = browser.new_context()
    try:
        copy.add_cookies(page.context.cookies())
        other = copy.new_page()
        other.goto(f"{live_server}/ui/queues/emails")
        assert other.url == f"{live_server}/ui/queues/emails"  # the copy works while the session lives
        page.click("button:has-text('Sign out')")
        page.wait_for_url(f"{live_server}/ui/sign-in")
        other.goto(f"{live_server}/ui/queues/emails")
        assert "/ui/sign-in" in other.url
    finally:
        copy.close()


def test_bulk_cancel_counts_first_and_acts_on_exactly_the_filters_shown(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store
) -> None:
    sign_in(page, live_server, admin_token, then="/ui/queues/billing?status=dead&item_key_prefix=digest:")
    assert page.locator("table.events tbody tr").inner_text() == "No events match."
    # The page offers no cancel for dead events, and says why; reached directly, the
    # confirmation refuses too, with nothing to press.
    assert page.locator("a:has-text('Cancel matching pending events')").count() == 0
    assert "pending events only" in page.locator("#bulk-refused-cancel").inner_text()
    page.goto(f"{live_server}/ui/queues/billing/events/cancel?status=dead&item_key_prefix=digest:")
    assert "pending events only" in page.locator(".flash-error").inner_text()
    assert page.locator("form button.danger").count() == 0  # nothing to press

    page.goto(f"{live_server}/ui/queues/billing?item_key_prefix=digest:")
    assert "8 events match these filters" in page.locator("#total").inner_text()
    page.click("a:has-text('Cancel matching pending events')")
    assert page.locator("#bulk-count").inner_text() == "8 pending events will be cancelled."
    page.fill("#reason", "digest moved to Mondays")
    shot(page, "bulk-confirm")
    page.click("button:has-text('Cancel 8 events')")
    assert "Cancelled 8 pending events" in page.locator(".flash-ok").inner_text()
    assert page.url.endswith("/ui/queues/billing?item_key_prefix=digest%3A")
    timeline = store.events.timeline("billing", "digest:3")
    assert (timeline[-1].action, timeline[-1].details["reason"]) == ("cancelled", "digest moved to Mondays")
    assert store.events.get("billing", "receipt:4").status != "cancelled"  # outside the filter


def test_queue_page_charts_refresh_count_and_pages(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store
) -> None:
    sign_in(page, live_server, admin_token, then="/ui/queues/emails?refresh=2")
    assert page.locator("#live svg.chart-ok rect").count() > 0  # its own last hour
    assert re.fullmatch(r"[\d\u202f]+ events match", page.locator("#total").inner_text())
    shot(page, "queue")
    pending = page.locator("#live .stats div").first.locator("dd")
    before = int(pending.inner_text().replace("\u202f", ""))
    store.events.schedule(store.queues.get("emails"), NewEvent(item_key="new:1", data={}), actor="svc")
    expect(pending).to_have_text(str(before + 1), timeout=8_000)  # swapped in place, no reload
    page.reload()  # the list as it is now: the new event is due now, among the latest due first
    rows = page.locator("table.events tbody tr")
    first_rows = rows.all_inner_texts()
    follow(page, "a[rel=next]")
    assert rows.all_inner_texts() not in ([], first_rows)
    follow(page, "a[rel=prev]")
    assert rows.all_inner_texts() == first_rows


def test_schedules_settings_and_tokens_as_an_admin(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store, dialogs: list[str]
) -> None:
    sign_in(page, live_server, admin_token, then="/ui/queues/emails")
    follow(page, "nav.tabs a:text-is('Schedules')")
    rows = page.locator("table.schedules tbody tr")
    assert rows.count() == 3
    digest = rows.filter(has_text="weekly-digest")
    assert digest.locator("ol.nexts li").count() == 5
    assert "Europe/Lisbon" in digest.inner_text()
    shot(page, "schedules")
    digest.locator("button:text-is('Pause')").click()
    assert dialogs[-1].startswith("Pause the schedule weekly-digest?")
    assert "Paused schedule weekly-digest" in page.locator(".flash-ok").inner_text()
    assert store.schedules.get("emails", "weekly-digest").paused
    rows.filter(has_text="weekly-digest").locator("button:text-is('Resume')").click()
    expect(page.locator(".flash-ok")).to_contain_text("Resumed schedule weekly-digest")  # the POST ended
    assert not store.schedules.get("emails", "weekly-digest").paused

    page.click("nav.tabs a:text-is('Settings')")
    assert page.locator("td[data-setting='max_attempts']").inner_text() == "2"
    page.fill("input[name='setting:max_attempts']", "6")
    page.fill("input[name='setting:rate_per_second']", "25")
    shot(page, "settings")
    page.click("button:has-text('Save settings')")
    assert "Saved" in page.locator(".flash-ok").inner_text()
    assert page.locator("td[data-setting='max_attempts']").inner_text() == "6"
    assert store.queues.get("emails").rate_per_second == 25

    page.click("header nav a:text-is('Tokens')")
    page.fill("input[name=name]", "reports-service")
    page.fill("input[name=queues]", "reports")
    page.click("button:has-text('Create token')")
    token = page.locator("#new-token").inner_text()
    assert token.startswith("tkl_")
    assert store.tokens.authenticate(token) is not None
    shot(page, "tokens")
    page.goto(f"{live_server}/ui/tokens")
    assert token not in page.content()  # shown once
    row = page.locator("table.tokens tbody tr").filter(has_text="reports-service")
    row.locator("button:has-text('Revoke')").click()
    assert "Revoked" in page.locator(".flash-ok").inner_text()
    assert store.tokens.authenticate(token) is None


def test_a_queue_token_sees_its_own_schedules_and_settings_and_no_admin_page(
    page: Any, live_server: str, store: Store, demo: dict[str, Any]
) -> None:
    token = store.tokens.create("billing-service", queues=["billing"])
    sign_in(page, live_server, token, then="/ui/queues/billing/schedules")
    assert page.locator("table.schedules tbody tr").all_inner_texts()[0].startswith("invoice-run")
    assert page.locator("header nav a:text-is('Tokens')").count() == 0
    for path in ("/ui/queues/emails/schedules", "/ui/queues/emails/settings", "/ui/queues/emails/events/cancel"):
        response = page.goto(f"{live_server}{path}")
        assert response.status == 404, path
    response = page.goto(f"{live_server}/ui/tokens")
    assert response.status == 403
    assert "admin" in page.locator("main").inner_text()
    page.goto(f"{live_server}/ui/queues/billing/settings")
    assert page.locator("td[data-setting='max_attempts']").inner_text() == "5"
    assert page.locator("input[name^='setting:']").count() == 0  # read-only for a queue token
    response = page.goto(f"{live_server}/ui/no/such/page")
    assert response.status == 404
    assert response.headers["content-type"].startswith("text/html")
    assert "404" in page.locator("h1").inner_text()


def test_a_next_with_cr_lf_a_long_timeline_and_readable_details(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store
) -> None:
    page.goto(f"{live_server}/ui/sign-in?next=/ui/%0d%0aX:1")
    page.fill("#token", admin_token)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{live_server}/ui/")  # a safe page, not a 500
    queue = store.queues.get("emails")
    for i in range(150):
        store.events.schedule(queue, NewEvent(item_key="busy", data={"n": i}), actor="svc", on_conflict="debounce")
    page.goto(f"{live_server}/ui/queues/emails/events/busy")
    assert page.locator("ol.timeline .tl-action").count() == 100  # the newest 100 of 150
    assert page.locator("ol.timeline .tl-action").first.inner_text() == "debounced"
    follow(page, "a:has-text('Older entries')")
    actions = page.locator("ol.timeline .tl-action").all_inner_texts()
    assert len(actions) == 50 and actions[-1] == "enqueued"
    page.goto(f"{live_server}/ui/queues/emails/events/weekly-digest")  # a schedule's own timeline
    details = page.locator("ol.timeline").inner_text()
    assert "cron, timezone, data" in details
    assert "[" not in details and "False" not in details and "None" not in details
