"""`tickler worker --metrics-port` serves the per-queue gauges too: every process answers the
same values, read from the database at scrape time."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.helpers_wait import wait_until
from tests.workers.spawn import logs, start_worker, stop_workers
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None  # not listening yet


def test_worker_metrics_carry_the_queue_gauges(
    database_url: str, store: Store, make_queue: Callable[..., Queue], tmp_path: Path
) -> None:
    queue = make_queue("work")
    for n in range(3):
        store.events.schedule(queue, NewEvent(item_key=f"later-{n}", delay_seconds=3600, data={}), actor="test")
    port = _free_port()
    worker = start_worker(database_url, tmp_path, "--metrics-port", str(port), name="gauges")
    try:
        text = wait_until(lambda: _scrape(port), timeout=60, what=lambda: logs(tmp_path))
    finally:
        stop_workers([worker])
    assert "tickler_queue_gauges_up 1.0" in text
    assert 'tickler_queue_pending{queue="work"} 3.0' in text
    assert 'tickler_queue_due{queue="work"} 0.0' in text
    assert 'tickler_queue_paused{queue="work"} 0.0' in text
