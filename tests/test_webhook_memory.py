"""The webhook deliverer keeps nothing per delivery once it is done: the process's resident memory
stays level over 100,000 deliveries to a real local receiver (after a warm-up). RSS, not
tracemalloc: tracing every allocation made the test several times slower on a shared machine."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from tests.receiver_async import answering_receiver_process
from tickler.scheduler.delivery import Delivered
from tickler.scheduler.delivery.webhook import WebhookDeliverer
from tickler.scheduler.models import Event, Lease, Queue

WINDOW = 500  # requests in flight at once
DELIVERIES = 100_000


def lease(queue: Queue, n: int) -> Lease:
    now = datetime.now(UTC)
    event = Event(
        n, queue.name, f"k{n}", None, now, {"n": n}, "in_flight", now, "test", None, None, now, "w", 0, 10, None, 1
    )
    return Lease(str(uuid.uuid4()), queue.name, None, now, "w", (event,))


async def deliver_many(deliverer: WebhookDeliverer, queue: Queue, start: int, count: int) -> None:
    room = asyncio.Semaphore(WINDOW)

    async def one(n: int) -> None:
        try:
            assert isinstance(await deliverer.deliver(queue, lease(queue, n)), Delivered)
        finally:
            room.release()

    running: set[asyncio.Task[None]] = set()  # only those not done: the test keeps nothing either
    for n in range(start, start + count):
        await room.acquire()
        task = asyncio.create_task(one(n))
        running.add(task)
        task.add_done_callback(running.discard)
    await asyncio.gather(*running)


@pytest.mark.timeout(600)
def test_memory_stays_level_over_a_hundred_thousand_deliveries(make_queue: Callable[..., Queue]) -> None:
    with answering_receiver_process() as url:
        queue = make_queue("hooks", delivery_mode="webhook", webhook_url=url)
        deliverer = WebhookDeliverer()

        async def main() -> int:
            try:
                await deliver_many(deliverer, queue, 0, 2_000)  # warm-up: the pool, the gate, the caches
                before = resident()
                await deliver_many(deliverer, queue, 2_000, DELIVERIES)
                return resident() - before
            finally:
                await deliverer.aclose()

        grown = asyncio.run(main())
    # Level: 100,000 deliveries kept at ~1 KiB each would add ~100 MiB, and a leak of 100 bytes
    # each ~10 MiB; the allocator's own slack stays within a few.
    assert grown < 8 * 1024 * 1024, f"resident memory grew {grown} bytes over {DELIVERIES:,} deliveries"


def resident() -> int:
    """This process's resident memory, bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
