"""The dashboard at a desktop width (1280 px) and a phone's (390 px) in a real browser (headless
Chromium, Playwright): no page is wider than the window (tables scroll inside their cards, the
navigation wraps, nothing is cut off), and axe-core finds no serious or critical accessibility
violation on the overview, a queue, a key and the tokens page.

axe-core is vendored in tests/assets/axe.min.js (MPL-2.0, see tests/assets/README.md), so the
test runs offline. With TICKLER_UI_SCREENSHOTS=<dir> the phone-width pages are saved as
screenshots (`ui-phone-*.png`; docs/images holds the ones docs/dashboard.md shows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.ui_browser import SHOTS, browser, demo, dialogs, needs_chromium, page, sign_in

pytestmark = needs_chromium
__all__ = ["browser", "demo", "dialogs", "page"]  # fixtures, shared with the other browser tests

AXE = Path(__file__).parent / "assets" / "axe.min.js"
# The pages every width is checked on: the overview, a queue (with fair backlogs and a search),
# one key, the tokens page; and the other pages a person reaches from them.
PAGES = {
    "overview": "/ui/",
    "queue": "/ui/queues/billing",
    "queue-search": "/ui/queues/emails?status=due",
    "key": "/ui/queues/billing/events/digest:1",
    "tokens": "/ui/tokens",
    "settings": "/ui/queues/emails/settings",
    "schedules": "/ui/queues/emails/schedules",
    "leases": "/ui/leases",
}
AXE_PAGES = ("overview", "queue", "key", "tokens")


def _overflow(page: Any) -> dict[str, Any]:
    """How much wider than the window the page is, and the elements that stick out of it."""
    return dict(
        page.evaluate(
            """() => {
              const width = window.innerWidth;
              const out = [];
              for (const el of document.querySelectorAll('body *')) {
                const box = el.getBoundingClientRect();
                if (box.width && box.right > width + 0.5 && !el.closest('.table-wrap, pre')) {
                  out.push(el.tagName.toLowerCase() + (el.className ? '.' + String(el.className).split(' ')[0] : ''));
                }
              }
              return {scroll: document.documentElement.scrollWidth, width, out: out.slice(0, 8)};
            }"""
        )
    )


@pytest.mark.parametrize("width", [1280, 390])
def test_no_page_is_wider_than_the_window(
    page: Any, live_server: str, admin_token: str, demo: dict[str, Any], width: int
) -> None:
    page.set_viewport_size({"width": width, "height": 860})
    sign_in(page, live_server, admin_token)
    for name, path in PAGES.items():
        page.goto(f"{live_server}{path}")
        found = _overflow(page)
        assert found["scroll"] <= found["width"], (name, found)
        assert not found["out"], (name, found)
        if width < 500 and SHOTS:  # the first screenful, as a phone shows it
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(SHOTS) / f"ui-phone-{name}.png"))
    # The navigation wraps rather than cutting "Sign out" off, and it can be pressed.
    page.goto(f"{live_server}/ui/")
    sign_out = page.locator("button:has-text('Sign out')")
    box = sign_out.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
    sign_out.click()
    page.wait_for_url(f"{live_server}/ui/sign-in")


@pytest.mark.skipif(not AXE.exists(), reason="tests/assets/axe.min.js is not there")
def test_axe_finds_no_serious_violation(page: Any, live_server: str, admin_token: str, demo: dict[str, Any]) -> None:
    sign_in(page, live_server, admin_token)
    script = AXE.read_text()
    for name in AXE_PAGES:
        page.goto(f"{live_server}{PAGES[name]}")
        page.evaluate(script)
        violations = page.evaluate(
            """async () => {
              const result = await axe.run(document, {resultTypes: ['violations']});
              return result.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}));
            }"""
        )
        assert violations == [], (name, violations)
    # Breadcrumbs are links by their underline too, not by colour alone.
    page.goto(f"{live_server}{PAGES['key']}")
    crumb = page.locator(".heading h1 a").first
    assert "underline" in crumb.evaluate("a => getComputedStyle(a).textDecorationLine")
    page.keyboard.press("Tab")  # the first stop is the skip link, shown when focused
    skip = page.locator("a.skip-link")
    assert skip.evaluate("a => a === document.activeElement")
    box = skip.bounding_box()
    assert box is not None and box["y"] >= 0
