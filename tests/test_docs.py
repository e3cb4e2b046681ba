"""/docs renders /openapi.json with Swagger UI from files served here: no CDN, no other host."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from flask.testing import FlaskClient

from tests.ui_browser import browser

__all__ = ["browser"]  # the browser tests' Chromium, a fixture

CHROMIUM = os.environ.get("TICKLER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

LINKS = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
CSS_URLS = re.compile(r"""url\(\s*["']?([^"')]+)""")


def test_docs_page_and_its_assets_are_served_here(client: FlaskClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert "://" not in html
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "http" not in csp
    links = LINKS.findall(html)
    assert {"/docs/assets/swagger-ui.css", "/docs/assets/swagger-ui-bundle.js", "/docs/init.js"} <= set(links)
    for link in links:
        assert link.startswith("/") and not link.startswith("//"), link
        asset = client.get(link)
        body = asset.get_data(as_text=link.endswith((".css", ".js")))
        asset.close()  # files are streamed: close them
        assert asset.status_code == 200 and len(body) > 0, link
        expected = {".css": "text/css", ".js": "text/javascript", ".png": "image/png"}[Path(link).suffix]
        assert asset.mimetype == expected, (link, asset.mimetype)
        assert asset.headers["Content-Security-Policy"] == csp
        if link.endswith(".css"):
            assert isinstance(body, str)
            external = [u for u in CSS_URLS.findall(body) if not u.startswith("data:")]
            assert external == [], external
    init = client.get("/docs/init.js").get_data(as_text=True)
    assert 'url: "/openapi.json"' in init and "validatorUrl: null" in init  # no online validator badge
    licence = client.get("/docs/assets/LICENSE")
    text = licence.get_data(as_text=True)
    licence.close()
    assert licence.status_code == 200 and "Apache License" in text
    missing = client.get("/docs/assets/swagger-ui.js.map")
    assert missing.status_code == 404 and missing.mimetype == "application/problem+json"
    assert client.get("/docs/assets/..%2fflask_swagger_ui.py").status_code == 404


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}: apt-get install chromium")
def test_docs_render_in_a_browser_that_cannot_leave_this_host(live_server: str, browser: Any) -> None:
    here = urlparse(live_server).netloc
    elsewhere: list[str] = []

    def only_here(route: Any) -> None:
        if urlparse(route.request.url).netloc == here:
            route.continue_()
        else:  # as on a machine with no internet; and recorded, so the test can fail on it
            elsewhere.append(route.request.url)
            route.abort()

    # The browser tests' Chromium (tests/ui_browser.py), started for this module and stopped after it.
    context = browser.new_context()
    try:
        page = context.new_page()
        page.route("**/*", only_here)
        page.goto(f"{live_server}/docs")
        # Swagger UI fetched /openapi.json and drew an operation of it
        page.get_by_text("Retry every dead event with this group and/or key prefix").first.wait_for(timeout=30_000)
        assert page.locator(".info .title").first.inner_text().startswith("tickler")
    finally:
        context.close()
    assert elsewhere == []
