"""A delivery slower than its lease keeps the lease: the dispatcher extends it while it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tests.helpers_wait import wait_until
from tests.helpers_worker import recording_worker
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store


def test_a_handler_slower_than_its_lease_is_delivered_once(
    store: Store, make_queue: Callable[..., Queue], database_url: str
) -> None:
    queue = make_queue("slow", lease_seconds=1)
    simulated_work = threading.Event()  # never set: the handler "works" for 2.5 s

    with recording_worker(database_url, "slow", lambda _: simulated_work.wait(2.5), name="slow-worker") as calls:
        store.events.schedule(queue, NewEvent(item_key="k", data={}), actor="test")
        wait_until(lambda: store.events.get("slow", "k").status == "delivered", timeout=20)
    event = store.events.get("slow", "k")
    assert calls == [event.id]
    assert event.redeliver_count == 0
    assert [t.action for t in store.events.timeline("slow", "k")] == ["enqueued", "claimed", "delivered"]
