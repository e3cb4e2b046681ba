"""The pull-consumer loop for asyncio: the same rules as `consume.run_consumer` (ack on return,
nack on raise, leases kept alive while their handler runs, held leases finished on a stop), with
one heartbeat task per held lease instead of a thread."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from tickler_client._tracing import mark_failed, process_span
from tickler_client.consume import OUTAGE_PAUSE, ConsumeStats, Nack, error_text, log
from tickler_client.errors import ServiceUnavailable, StaleLease, TicklerError, TransportError
from tickler_client.models import Lease, NackResult

Handler = Callable[[Lease], Awaitable[object] | object]


class AsyncLeaseCalls(Protocol):
    """The calls the loop needs (an `AsyncClient` has them)."""

    async def ack(self, lease: Lease | str) -> None: ...

    async def nack(
        self, lease: Lease | str, error: str, *, retry_in_seconds: float | None = ..., dead: bool = ...
    ) -> NackResult: ...

    async def extend(self, lease: Lease | str, seconds: float) -> Lease: ...


async def _keep_alive(calls: AsyncLeaseCalls, lease: Lease, length: float, stats: ConsumeStats) -> None:
    """Extend the lease every half lease until cancelled; return when it is found lost."""
    wait = length / 2
    while True:
        await asyncio.sleep(wait)
        try:
            await calls.extend(lease, length)
        except StaleLease:
            stats.lost += 1
            log.warning("tickler lease %s was lost before its handler finished", lease.lease_id)
            return
        except TicklerError as error:  # no answer, a 503: try again soon, the lease may still hold
            log.warning("tickler lease %s could not be extended: %s", lease.lease_id, error)
            wait = min(length / 4, OUTAGE_PAUSE)
            continue
        stats.extended += 1
        wait = length / 2


async def _finish(
    calls: AsyncLeaseCalls, lease: Lease, handler: Handler, stats: ConsumeStats, heartbeat: asyncio.Task[None]
) -> None:
    """Run the handler on one lease (its heartbeat task extends it meanwhile), then ack or nack it;
    inside the attempt's span when OpenTelemetry is installed, as the blocking loop does (this task
    owns the span: the context it sets stays with the task across its awaits)."""
    with process_span(lease):
        await _run_and_finish(calls, lease, handler, stats, heartbeat)


async def _run_and_finish(
    calls: AsyncLeaseCalls, lease: Lease, handler: Handler, stats: ConsumeStats, heartbeat: asyncio.Task[None]
) -> None:
    failure: Exception | None = None
    try:
        result = handler(lease)
        if inspect.isawaitable(result):
            await result
    except Exception as error:
        failure = error
    finally:
        # Before the ack or nack, so that no extend races it. Done already: it found the lease lost.
        lost = heartbeat.done()
        heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heartbeat
    if failure is not None:
        mark_failed(failure)
    if lost:
        return
    if failure is not None and not isinstance(failure, Nack):
        log.warning("tickler handler failed on lease %s: %s", lease.lease_id, failure, exc_info=failure)
        failure = Nack(error_text(failure))
    try:
        if failure is None:
            await calls.ack(lease)
            stats.acked += 1
        else:
            await calls.nack(lease, failure.error, retry_in_seconds=failure.retry_in_seconds, dead=failure.dead)
            stats.nacked += 1
    except (StaleLease, TransportError, ServiceUnavailable) as error:
        stats.lost += 1
        log.warning("tickler lease %s not finished (%s); its events will be delivered again", lease.lease_id, error)


@contextlib.asynccontextmanager
async def _stop_on_signals(stop: asyncio.Event, enabled: bool) -> AsyncIterator[None]:
    """SIGINT and SIGTERM set `stop` while the loop runs, where the event loop can take signal
    handlers (its thread is the main thread, not on Windows); removed afterwards."""
    loop = asyncio.get_running_loop()
    previous: dict[signal.Signals, Any] = {}
    if enabled:
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):
                break
            previous[sig] = handler
    try:
        yield
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)  # asyncio would leave the default, not the caller's handler


async def run_consumer(
    calls: AsyncLeaseCalls,
    queue: str,
    claim: Callable[[], Awaitable[list[Lease]]],
    handler: Handler,
    *,
    lease_seconds: float | None,
    stop: asyncio.Event,
    handle_signals: bool,
) -> ConsumeStats:
    """The loop behind `AsyncClient.consume` (documented there)."""
    stats = ConsumeStats()
    async with _stop_on_signals(stop, handle_signals):
        while not stop.is_set():
            try:
                leases = await claim()
            except (TransportError, ServiceUnavailable) as error:
                log.warning("tickler claim on %s failed (%s); trying again", queue, error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), OUTAGE_PAUSE)
                continue
            stats.claimed += len(leases)
            # Every held lease is kept alive from the claim on, also while it waits for its turn.
            heartbeats = [
                asyncio.create_task(_keep_alive(calls, lease, max(lease_seconds or lease.lease_seconds, 0.2), stats))
                for lease in leases
            ]
            # Held leases are finished even after a stop: none is left to expire and cost an attempt.
            for lease, heartbeat in zip(leases, heartbeats, strict=True):
                await _finish(calls, lease, handler, stats, heartbeat)
    return stats


__all__ = ["AsyncLeaseCalls", "Handler", "run_consumer"]
