"""The report page as people read it: rendered by Debian's headless Chromium (Playwright drives the
system browser) at the page's own width, every table within the page, no empty queue in a legend.

The tables are built here (a month of seven queues, one of which only enqueued) rather than by
Spark, so the test takes seconds. With TICKLER_REPORT_SCREENSHOT=<file.png> it also saves the
screenshot shown in docs/pipeline.md (docs/images/pipeline-report.png).
"""

from __future__ import annotations

import os
import random
import shutil
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tickler.pipeline.report import LATENESS_BUCKETS, Period
from tickler.pipeline.report_html import render

playwright_sync = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")

CHROMIUM = os.environ.get("TICKLER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
PERIOD = Period(date(2026, 11, 1), date(2026, 12, 1))
QUEUES = ("emails", "sms", "webhooks-billing-invoices-eu-west", "reminders", "push", "exports")
IDLE = "idle-queue"  # enqueued only: nothing to chart

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}: apt-get install chromium (as .ci/run does)"
)


def _queue_row(rng: random.Random, queue: str, scale: int) -> dict[str, Any]:
    delivered = rng.randint(50, 150) * scale
    failed = rng.randint(0, delivered // 10)
    return {
        "queue": queue, "enqueued": delivered + rng.randint(0, 40), "replaced": 3, "rescheduled": rng.randint(0, 90),
        "updated": 1, "cancelled": rng.randint(0, 30), "claimed": delivered + failed, "delivered": delivered,
        "failed": failed, "lease_expired": rng.randint(0, 5), "released": 0, "dead": rng.randint(0, 9),
        "failed_attempts": failed, "failure_rate": failed / (failed + delivered),
        "lateness_p50_s": rng.uniform(0.1, 3), "lateness_p95_s": rng.uniform(5, 90),
        "lateness_p99_s": rng.uniform(90, 4000),
        "lateness_avg_s": 2.0, "attempts_avg": 1.0 + failed / delivered, "attempts_max": 7, "redelivered_share": 0.04,
        "enqueue_to_delivery_p50_s": rng.uniform(60, 86400), "enqueue_to_delivery_p95_s": 90000.0,
        "enqueue_to_delivery_p99_s": 200000.0,
    }  # fmt: skip


def sample_tables() -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(7)
    daily, summary, histogram, hourly, attempts, dead = [], [], [], [], [], []
    for n, queue in enumerate(QUEUES):
        scale = 10 // (n + 1)
        for day in range(30):
            daily.append({**_queue_row(rng, queue, scale), "day": PERIOD.since + timedelta(days=day)})
        summary.append(_queue_row(rng, queue, 30 * scale))
        for bucket, (label, _) in enumerate(LATENESS_BUCKETS):
            histogram.append({"queue": queue, "bucket": bucket, "label": label,
                              "deliveries": int(scale * 4000 / (1 + abs(bucket - 1 - n % 4)) ** 2)})  # fmt: skip
        for hour in range(24):
            busy = 3 if 8 <= hour <= 18 else 1
            hourly.append({"queue": queue, "hour": hour, "delivered": busy * scale * rng.randint(20, 40),
                           "enqueued": busy * scale * rng.randint(20, 40)})  # fmt: skip
        for tries in range(1, 13):
            attempts.append({"queue": queue, "attempts": tries, "deliveries": int(scale * 5000 / 4**tries) + 1})
        dead.append({"queue": queue, "reason": "attempts exhausted", "dead": 4 * scale})
        dead.append({"queue": queue, "reason": "gone (410)", "dead": scale})
    idle = {**_queue_row(rng, IDLE, 1), "delivered": 0, "failed_attempts": 0, "failure_rate": None, "dead": 0}
    daily.append({**idle, "day": PERIOD.since})
    summary.append(idle)
    top = [{"kind": "group", "queue": "emails", "name": f"customer-{n}", "failures": 40 - n, "events": 9}
           for n in range(10)]  # fmt: skip
    top += [{"kind": "principal", "queue": None, "name": f"service-{n}", "failures": 90 - n, "events": 30}
            for n in range(10)]  # fmt: skip
    return {"daily": daily, "summary": summary, "lateness_histogram": histogram, "top_failures": top,
            "hourly": hourly, "attempts_histogram": attempts, "dead_reasons": dead}  # fmt: skip


# For each table: how far its right edge reaches, and whether its content is wider than its box.
_FIT = """() => Array.from(document.querySelectorAll('table')).map(t => ({
    right: t.getBoundingClientRect().right, scroll: t.scrollWidth, width: t.clientWidth,
    parent: t.parentElement.clientWidth, page: document.documentElement.clientWidth }))"""
_SCROLLERS = """() => Array.from(document.querySelectorAll('*')).filter(e => {
    const s = getComputedStyle(e); return ['auto', 'scroll'].includes(s.overflowX) }).length"""


def test_the_report_page_fits_and_its_legends_name_only_queues_with_data(tmp_path: Path) -> None:
    page_file = tmp_path / "report.html"
    html = render(sample_tables(), PERIOD, generated=datetime(2026, 12, 1, 6, tzinfo=UTC), source="jdbc")
    page_file.write_text(html, encoding="utf-8")
    # self-contained: inline SVG only
    assert "<script" not in html and "<link" not in html and "https://" not in html
    assert html.count("<svg") == 6
    for heading in ("Throughput by hour of day", "Lateness per queue", "Attempts per delivered event",
                    "Dead events by queue and reason"):  # fmt: skip
        assert heading in html
    legends = html.split('<div class="legend">')[1:]
    assert legends and all(IDLE not in legend.split("</div>")[0] for legend in legends)
    assert "10+" in html  # attempts of 10 and more share a bar

    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1080, "height": 900})
            page.goto(page_file.as_uri())
            tables = page.evaluate(_FIT)
            assert len(tables) == 4
            for table in tables:
                assert table["right"] <= table["page"], table  # nothing cut off at the page's edge
                assert table["scroll"] <= table["width"] <= table["parent"], table  # no column hidden
            assert page.evaluate(_SCROLLERS) == 0  # no scroll box inside the page (invisible in print)
            assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    wanted = os.environ.get("TICKLER_REPORT_SCREENSHOT")
    if wanted:
        shutil.copyfile(shot, wanted)
