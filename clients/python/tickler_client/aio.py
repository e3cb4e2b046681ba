"""The asyncio client: the calls, errors and retry rules of `Client`, awaited (for FastAPI,
aiohttp and other asyncio services)."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from tickler_client import _erasures, _events, _leases, _queues, _tokens
from tickler_client._bind import AwaitsSends, awaiting, awaiting_pages
from tickler_client.aio_consume import Handler, run_consumer
from tickler_client.consume import ConsumeStats, default_worker_name
from tickler_client.errors import StaleLease, TicklerError
from tickler_client.models import Lease, NackResult, Schedule


class AsyncClient(AwaitsSends):
    """`Client` for asyncio: every call is a coroutine with the same arguments, answer, errors
    and retries; `search` is an async iterator and `consume` runs the pull consumer as a task.
    Create it inside the running event loop, and close it (`await client.aclose()`, or use
    `async with`).

    >>> async with AsyncClient("http://127.0.0.1:8080", token) as tickler:
    ...     await tickler.schedule("emails", "welcome:ana@example.com", {"template": "welcome"}, delay=86400)
    """

    # events
    schedule = awaiting(_events.schedule)
    schedule_batch = awaiting(_events.schedule_batch)
    reschedule = awaiting(_events.reschedule)
    cancel = awaiting(_events.cancel)
    cancel_matching = awaiting(_events.cancel_matching)
    get = awaiting(_events.get)
    timeline = awaiting(_events.timeline)
    search_page = awaiting(_events.search_page)
    search = awaiting_pages(_events.search)
    retry = awaiting(_events.retry)
    retry_matching = awaiting(_events.retry_matching)
    # pull consumers
    claim = awaiting(_leases.claim)
    ack_many = awaiting(_leases.ack_many)
    extend = awaiting(_leases.extend)
    # queues (admin) and recurring schedules
    put_queue = awaiting(_queues.put_queue)
    get_queue = awaiting(_queues.get_queue)
    list_queues = awaiting(_queues.list_queues)
    pause_queue = awaiting(_queues.pause_queue)
    resume_queue = awaiting(_queues.resume_queue)
    delete_queue = awaiting(_queues.delete_queue)
    put_schedule = awaiting(_queues.put_schedule)
    get_schedule = awaiting(_queues.get_schedule)
    delete_schedule = awaiting(_queues.delete_schedule)
    # tokens (admin)
    create_token = awaiting(_tokens.create_token)
    list_tokens = awaiting(_tokens.list_tokens)
    revoke_token = awaiting(_tokens.revoke_token)

    # erasures (admin)
    erase = awaiting(_erasures.erase)
    erasure = awaiting(_erasures.erasure)
    erasures = awaiting(_erasures.erasures)

    async def ack(self, lease: Lease | str) -> None:
        try:
            await self._transport.send(_leases.ack(lease))
        except StaleLease as stale:
            await self._explain(stale, lease)
            raise

    async def nack(
        self, lease: Lease | str, error: str, *, retry_in_seconds: float | None = None, dead: bool = False
    ) -> NackResult:
        try:
            return await self._transport.send(_leases.nack(lease, error, retry_in_seconds=retry_in_seconds, dead=dead))
        except StaleLease as stale:
            await self._explain(stale, lease)
            raise

    ack.__doc__, nack.__doc__ = _leases.ack.__doc__, _leases.nack.__doc__

    async def _explain(self, stale: StaleLease, lease: Lease | str) -> None:
        """A StaleLease the server could not explain is completed from the key's timeline."""
        key = _leases.key_of(lease)
        if stale.lease_status == "unknown" and key is not None:
            with contextlib.suppress(TicklerError):
                _leases.explain(stale, lease, await self.timeline(*key))

    async def list_schedules(self, queue: str, *, page_size: int = 100) -> list[Schedule]:
        """Every schedule of a queue, ordered by key (all pages). Retried."""
        return [schedule async for schedule in self._every(_queues.schedules(queue, page_size=page_size))]

    async def consume(
        self,
        queue: str,
        handler: Handler,
        *,
        worker: str | None = None,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 10.0,
        stop: asyncio.Event | None = None,
        handle_signals: bool = True,
    ) -> ConsumeStats:
        """Run a pull consumer until `stop` is set or SIGINT/SIGTERM arrives (see
        `Client.consume`): `handler(lease)` may be a coroutine function or a plain one; returning
        acks the lease, raising nacks it (`Nack` chooses how). A task per held lease extends it
        every half lease while it waits or its handler runs. Signal handlers are installed only
        where the event loop can take them (its thread is the main thread).

        >>> stop = asyncio.Event()
        >>> stats = await tickler.consume("emails", send, worker="mailer-1", stop=stop)
        """
        name = worker or default_worker_name()

        async def claim() -> list[Lease]:
            return await self.claim(
                queue, worker=name, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds
            )

        return await run_consumer(
            self,
            queue,
            claim,
            handler,
            lease_seconds=lease_seconds,
            stop=stop or asyncio.Event(),
            handle_signals=handle_signals,
        )

    async def aclose(self) -> None:
        """Close the HTTP connections (also done on leaving an `async with` block)."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
