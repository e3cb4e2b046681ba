"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against the
app behind a real local HTTP server.

Skipped, saying why, only where no Chromium can be found (CI installs it: .ci/run). With
TICKLER_UI_SCREENSHOTS=<dir> the tests also save a screenshot of every page there
(`make screenshots` refreshes docs/images/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests import ui_demo
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store
from tickler.scheduler.store.dashboard import DashboardStore

playwright_sync = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")

CHROMIUM = os.environ.get("TICKLER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",  # root, in a container
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = os.environ.get("TICKLER_UI_SCREENSHOTS")

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM}: apt-get install chromium chromium-driver (as .ci/run does)",
)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the whole session; each test gets its own context (cookies)."""
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # the confirm() of bulk and destructive buttons
    yield page
    context.close()


@pytest.fixture
def demo(store: Store) -> dict[str, Any]:
    return ui_demo.populate(store, scale=1.0 if SHOTS else 0.1)


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"ui-{name}.png"), full_page=True)


def sign_in(page: Any, base: str, token: str, then: str | None = None) -> None:
    """Sign in with `token` (landing on the overview), then open the page at path `then` if given."""
    page.goto(f"{base}/ui/")
    assert "/ui/sign-in" in page.url
    shot(page, "sign-in")
    page.fill("#token", token)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{base}/ui/")
    if then is not None:
        page.goto(f"{base}{then}")


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
    assert page.locator("table.events tbody tr").filter(has_text=ui_demo.STORY_KEY).count() == 1
    shot(page, "queue")

    page.fill("#find-key", ui_demo.STORY_KEY)
    page.click("button:has-text('Open')")
    page.wait_for_url(f"{live_server}/ui/queues/emails/events/{quote(ui_demo.STORY_KEY, safe=':@')}")
    actions = page.locator("ol.timeline .tl-action").all_inner_texts()
    assert actions == ["enqueued", "claimed", "failed", "claimed", "failed", "claimed", "dead"]
    timeline = page.locator("ol.timeline").inner_text()
    assert "HTTP 500 from https://hooks.example/mail" in timeline
    assert "worker-2" in timeline
    assert "attempt" in timeline
    shot(page, "key")

    page.click(".event-head button:has-text('Retry')")
    assert "Retried" in page.locator(".flash-ok").inner_text()
    assert page.locator(".event-head .status").inner_text() == "pending"
    assert page.locator("ol.timeline .tl-action").all_inner_texts()[-1] == "retried"
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
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], store: Store
) -> None:
    sign_in(page, live_server, admin_token, then="/ui/queues/emails")
    page.click("button:text-is('Pause')")
    assert page.locator("h1 .badge").inner_text() == "paused"
    assert _paused(store, "emails")
    page.click("button:text-is('Resume')")
    assert page.locator("h1 .badge").inner_text() == "running"
    assert not _paused(store, "emails")


def _paused(store: Store, queue: str) -> bool:
    [overview] = DashboardStore(store.engine).overview([queue])
    return overview.paused


def test_leases_page_lists_live_leases(page: Any, live_server: str, admin_token: str, demo: dict[str, Any]) -> None:
    sign_in(page, live_server, admin_token)
    page.click("a:text-is('Leases in flight')")
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
