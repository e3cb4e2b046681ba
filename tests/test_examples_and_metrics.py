"""The README's runnable example handlers work, and delivery shows up in /metrics."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from examples.handlers import handlers
from tests.helpers_wait import wait_until
from tickler.config import Settings
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.worker import Worker


def metric(client: FlaskClient, name: str, queue: str) -> float:
    for line in client.get("/metrics").get_data(as_text=True).splitlines():
        if line.startswith(f'{name}{{queue="{queue}"}} '):
            return float(line.split()[-1])
    return 0.0


def test_example_handlers_deliver_and_metrics_count_it(
    store: Store,
    make_queue: Callable[..., Queue],
    database_url: str,
    client: FlaskClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    emails, digests = make_queue("emails"), make_queue("digests")
    before = metric(client, "tickler_events_delivered_total", "emails")
    worker = Worker(handlers, settings=Settings(database_url=database_url, migrate_on_start=False), name="examples")
    worker.start()
    try:
        store.events.schedule(emails, NewEvent(item_key="welcome:ana", data={"to": "ana@example.com"}), actor="t")
        store.events.schedule(emails, NewEvent(item_key="bad", data={"to": "nobody"}), actor="t")
        store.events.schedule_batch(
            digests, [NewEvent(item_key=f"n{i}", group_key="ana@example.com", data={}) for i in range(3)], actor="t"
        )
        wait_until(lambda: store.queues.counts("emails")["delivered"] == 1, timeout=15)
        wait_until(lambda: store.queues.counts("emails")["dead"] == 1, timeout=15)
        wait_until(lambda: store.queues.counts("digests")["delivered"] == 3, timeout=15)
    finally:
        worker.stop()
    printed = capsys.readouterr().out
    assert "email to ana@example.com" in printed
    assert "digest for ana@example.com: ['n0', 'n1', 'n2']" in printed
    assert metric(client, "tickler_events_delivered_total", "emails") == before + 1
    assert metric(client, "tickler_events_dead_total", "emails") >= 1
    assert metric(client, "tickler_delivery_lateness_seconds_count", "digests") >= 3
    assert metric(client, "tickler_claim_batch_size_count", "digests") >= 1
