"""The worker's per-event path: the delivery threads' queue, and the claim and ack run on the driver."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import REGISTRY

from tickler.scheduler.dispatcher import _WorkQueue
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store


def _consumers(work: _WorkQueue[int | None], n: int, handle: Callable[[int], None]) -> list[threading.Thread]:
    def loop() -> None:
        while (item := work.get()) is not None:
            handle(item)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    return threads


def test_slow_deliveries_spread_over_every_idle_thread() -> None:
    """Waking one thread at a time still gives each of 8 blocked deliveries its own thread: the
    barrier opens only when all 8 run at once (it breaks after its timeout otherwise)."""
    work: _WorkQueue[int | None] = _WorkQueue()
    barrier = threading.Barrier(8, timeout=20)
    passed: list[int] = []
    lock = threading.Lock()

    def handle(item: int) -> None:
        barrier.wait()
        with lock:
            passed.append(item)

    threads = _consumers(work, 8, handle)
    work.put_many(range(8))
    work.put_many([None] * 8)
    for thread in threads:
        thread.join(timeout=30)
    assert not barrier.broken
    assert sorted(passed) == list(range(8))
    assert not any(thread.is_alive() for thread in threads)


def test_every_item_is_taken_once_and_the_sentinels_end_every_thread() -> None:
    work: _WorkQueue[int | None] = _WorkQueue()
    seen: list[int] = []
    lock = threading.Lock()

    def handle(item: int) -> None:
        with lock:
            seen.append(item)

    threads = _consumers(work, 4, handle)
    for start in range(0, 5_000, 100):  # batches, as the claim loop hands them over
        work.put_many(range(start, start + 100))
    work.put_many([None] * 4)
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert sorted(seen) == list(range(5_000))


def _delivered(queue: str) -> float:
    return REGISTRY.get_sample_value("tickler_events_delivered_total", {"queue": queue}) or 0.0


def test_a_batched_ack_counts_each_queues_events_and_names_only_live_leases(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    """One ack of leases of two queues (a group lease of 3 events among them) returns {lease: queue}
    of the live ones and counts delivered events per queue; a lease acked twice is not live."""
    a, b = make_queue("hot_a"), make_queue("hot_b")
    store.events.schedule_batch(a, [NewEvent(item_key=f"a{i}", data={"i": i}) for i in range(4)], actor="test")
    store.events.schedule_batch(b, [NewEvent(item_key=f"g{i}", data={}, group_key="g") for i in range(3)], actor="test")
    before = _delivered("hot_a"), _delivered("hot_b")
    leases_a = store.leases.claim(a, worker="w", limit=10)
    [lease_b] = store.leases.claim(b, worker="w", limit=10)
    assert len(leases_a) == 4 and len(lease_b.events) == 3
    assert [e.data for lease in leases_a for e in lease.events] == [{"i": i} for i in range(4)]
    store.leases.ack([leases_a[0].lease_id])
    done = store.leases.ack([lease.lease_id for lease in leases_a] + [lease_b.lease_id])
    assert done == {**{lease.lease_id: "hot_a" for lease in leases_a[1:]}, lease_b.lease_id: "hot_b"}
    assert (_delivered("hot_a") - before[0], _delivered("hot_b") - before[1]) == (4, 3)
    assert store.queues.counts("hot_a")["delivered"] == 4
    assert store.queues.counts("hot_b")["delivered"] == 3
