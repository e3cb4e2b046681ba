"""What the browser tests share: one headless Chromium per test module (Debian's, driven by
Playwright), a fresh context (cookies) per test, screenshots, and signing in.

Test modules import the fixtures (`from tests.ui_browser import browser, demo, dialogs, page`) and
list them in `__all__`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import ui_demo
from tickler.scheduler.models import Queue
from tickler.scheduler.store import Store

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

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM}: apt-get install chromium chromium-driver (as .ci/run does)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module's tests (a fresh context per test). Stopped when the
    module ends: Playwright's sync API keeps an asyncio loop running on the main thread while it
    is started, so a later test in the same process that calls asyncio.run() (the async client)
    would fail, and a second Playwright would refuse to start."""
    started = playwright_sync.sync_playwright().start()
    try:
        chromium = started.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        started.stop()


@pytest.fixture
def dialogs() -> list[str]:
    """The messages of the confirm() dialogs the page showed (each is accepted)."""
    return []


@pytest.fixture
def page(browser: Any, dialogs: list[str]) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(10_000)
    page = context.new_page()

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)  # the confirm() of destructive buttons
    yield page
    context.close()


@pytest.fixture
def demo(store: Store) -> dict[str, Queue]:
    """Realistic dashboard data (tests/ui_demo.py): small for the tests, full size for screenshots."""
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


def follow(page: Any, link: str) -> None:
    """Click a link and wait until the page it leads to has loaded: a click only starts the
    navigation, and rows read before it ends are the old page's or none at all."""
    href = page.locator(link).get_attribute("href")
    page.click(link)
    page.wait_for_url(re.compile(re.escape(href) + "$"), wait_until="load")
