"""A delivery slower than its lease keeps the lease: the dispatcher extends it while it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

from config import Settings
from scheduler.models import Event, NewEvent, Queue
from scheduler.store import Store
from scheduler.worker import Worker
from tests.helpers_wait import wait_until


def test_a_handler_slower_than_its_lease_is_delivered_once(
    store: Store, make_queue: Callable[..., Queue], database_url: str
) -> None:
    queue = make_queue("slow", lease_seconds=1)
    calls: list[int] = []
    simulated_work = threading.Event()  # never set: the handler "works" for 2.5 s

    worker = Worker(
        settings=Settings(database_url=database_url, migrate_on_start=False),
        name="slow-worker",
        reap_interval=0.2,
    )

    @worker.handler("slow")
    def handle(event: Event) -> None:
        calls.append(event.id)
        simulated_work.wait(2.5)

    worker.start()
    try:
        store.events.schedule(queue, NewEvent(item_key="k", data={}), actor="test")
        wait_until(lambda: store.events.get("slow", "k").status == "delivered", timeout=20)
    finally:
        worker.stop()
    event = store.events.get("slow", "k")
    assert calls == [event.id]
    assert event.redeliver_count == 0
    assert [t.action for t in store.events.timeline("slow", "k")] == ["enqueued", "claimed", "delivered"]
