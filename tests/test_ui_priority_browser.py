"""Priority and fair share on the dashboard (SPEC §10), in a real browser (headless Chromium):
each event's priority in the queue's list and on its key's page, and for a fair-share queue the
fairness keys with the largest due backlog; and the list's order by last change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.ui_browser import browser, dialogs, needs_chromium, page, sign_in
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import EventChanges, Store

pytestmark = needs_chromium
__all__ = ["browser", "dialogs", "page"]  # fixtures


def test_queue_page_shows_priorities_and_the_largest_fair_share_backlogs(
    page: Any, live_server: str, admin_token: str, store: Store, make_queue: Callable[..., Queue]
) -> None:
    tenants = make_queue("tenants", fair_share=True)
    plain = make_queue("plain")
    store.events.schedule_batch(
        tenants,
        [NewEvent(f"big-{i}", {}, fairness_key="acme") for i in range(30)]
        + [NewEvent(f"small-{i}", {}, fairness_key="tiny", priority=7) for i in range(3)]
        + [NewEvent("loose", {})],
        actor="test",
    )
    store.events.schedule_batch(plain, [NewEvent("p", {}, priority=-4)], actor="test")
    sign_in(page, live_server, admin_token, then="/ui/queues/tenants")
    backlog = page.locator("#fair-backlogs tbody tr")
    assert backlog.all_inner_texts()[:3] == ["acme\t30\t0", "tiny\t3\t0", "none\t1\t0"]  # none in groups
    headers = page.locator("table.events thead th").all_inner_texts()
    column = [h.strip().lower() for h in headers].index("priority")
    first = page.locator("table.events tbody tr").first.locator("td").nth(column)
    assert first.inner_text() in ("0", "7")
    assert set(page.locator("table.events td.priority").all_inner_texts()) == {"0", "7"}
    page.goto(f"{live_server}/ui/queues/tenants/events/small-1")
    assert "7 · fairness key tiny" in page.locator("dl").first.inner_text()
    page.goto(f"{live_server}/ui/queues/plain")
    assert page.locator("#fair-backlogs").count() == 0  # not a fair-share queue
    assert page.locator("table.events td.priority").all_inner_texts() == ["-4"]


def test_queue_page_orders_events_by_last_change(
    page: Any, live_server: str, admin_token: str, store: Store, make_queue: Callable[..., Queue]
) -> None:
    queue = make_queue("changes")
    store.events.schedule_batch(queue, [NewEvent(f"e{i}", {}, delay_seconds=60 * i) for i in range(3)], actor="test")
    store.events.change("changes", "e0", EventChanges(data={"again": True}), actor="test")  # the latest change
    sign_in(page, live_server, admin_token, then="/ui/queues/changes")
    keys = page.locator("table.events tbody tr td:first-child")
    assert keys.all_inner_texts() == ["e2", "e1", "e0"]  # opens by due time, latest first
    page.select_option("select[name=sort]", "-changed")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url("**sort=-changed**")
    assert keys.all_inner_texts() == ["e0", "e2", "e1"]  # newest change first (e1, e2: one write; by id)
    assert page.locator("select[name=sort]").input_value() == "-changed"
