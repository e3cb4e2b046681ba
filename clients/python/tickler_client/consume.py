"""The pull-consumer loop: long-poll for leases, hand each to a handler, ack or nack it, and keep
the leases of slow handlers alive with a heartbeat thread."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tickler_client.errors import ServiceUnavailable, StaleLease, TicklerError, TransportError
from tickler_client.models import Lease, NackResult

log = logging.getLogger("tickler_client")

# Pause after the server did not answer (or answered 503) before claiming again.
OUTAGE_PAUSE = 1.0
# A nack's error is kept by the server up to this length.
MAX_ERROR_LENGTH = 2000


class Nack(Exception):
    """Raise from a `consume` handler to choose how its failure is recorded.

    >>> def handle(lease: Lease) -> None:
    ...     if mailbox_full(lease):
    ...         raise Nack("mailbox full", retry_in_seconds=3600)
    ...     if address_gone(lease):
    ...         raise Nack("address gone", dead=True)
    """

    def __init__(self, error: str, *, retry_in_seconds: float | None = None, dead: bool = False) -> None:
        super().__init__(error)
        self.error = error
        self.retry_in_seconds = retry_in_seconds
        self.dead = dead


@dataclass
class ConsumeStats:
    """What a `consume` run did: leases claimed, acked, nacked, lease extensions sent, and leases
    lost (found stale when acking, nacking or extending — their events are delivered again)."""

    claimed: int = 0
    acked: int = 0
    nacked: int = 0
    extended: int = 0
    lost: int = 0


class LeaseCalls(Protocol):
    """The calls the loop needs (a `Client` has them)."""

    def claim(
        self, queue: str, *, worker: str, limit: int = ..., lease_seconds: float | None = ..., wait_seconds: float = ...
    ) -> list[Lease]: ...

    def ack(self, lease: Lease | str) -> None: ...

    def nack(
        self, lease: Lease | str, error: str, *, retry_in_seconds: float | None = ..., dead: bool = ...
    ) -> NackResult: ...

    def extend(self, lease: Lease | str, seconds: float) -> Lease: ...


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """A thread that extends every held lease each half lease, until the lease is released."""

    def __init__(self, calls: LeaseCalls, stats: ConsumeStats, lease_seconds: float | None) -> None:
        self._calls = calls
        self._stats = stats
        self._lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, float]] = {}  # lease id -> (length, when to extend: monotonic)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tickler-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def hold(self, leases: list[Lease]) -> None:
        now = time.monotonic()
        with self._lock:
            for lease in leases:
                length = max(self._lease_seconds or lease.lease_seconds, 0.2)
                self._held[lease.lease_id] = (length, now + length / 2)
        self._wake.set()

    def release(self, lease: Lease) -> bool:
        """Stop extending; False when the heartbeat already found the lease lost."""
        return self._drop(lease.lease_id)

    def _drop(self, lease_id: str) -> bool:
        with self._lock:
            return self._held.pop(lease_id, None) is not None

    def _run(self) -> None:
        while not self._stopping:
            now = time.monotonic()
            with self._lock:
                due = [(i, length) for i, (length, at) in self._held.items() if at <= now]
                upcoming = [at for _, at in self._held.values() if at > now]
            for lease_id, length in due:
                self._extend(lease_id, length)
            if due:
                continue  # look again: extending took time
            self._wake.wait(min(upcoming) - now if upcoming else None)
            self._wake.clear()

    def _extend(self, lease_id: str, length: float) -> None:
        try:
            self._calls.extend(lease_id, length)
        except StaleLease:
            if self._drop(lease_id):
                self._stats.lost += 1
                log.warning("tickler lease %s was lost before its handler finished", lease_id)
            return
        except TicklerError as error:  # no answer, a 503: try again soon, the lease may still hold
            log.warning("tickler lease %s could not be extended: %s", lease_id, error)
            self._plan(lease_id, length, min(length / 4, OUTAGE_PAUSE))
            return
        if self._plan(lease_id, length, length / 2):
            self._stats.extended += 1

    def _plan(self, lease_id: str, length: float, after: float) -> bool:
        with self._lock:
            if lease_id not in self._held:
                return False  # finished meanwhile
            self._held[lease_id] = (length, time.monotonic() + after)
            return True


def set_from_a_signal(event: threading.Event) -> None:
    """Set `event` from a signal handler. Not directly: the handler runs in the main thread,
    perhaps while that thread is inside `event.wait()` holding the event's lock, and `set()`
    would wait for that lock forever."""
    threading.Thread(target=event.set, name="tickler-signal").start()


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, enabled: bool) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` while the loop runs (main thread only); the old handlers come
    back afterwards."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handle(signum: int, frame: Any) -> None:
        log.info("tickler consumer stopping on signal %s", signum)
        set_from_a_signal(stop)

    previous = {sig: signal.signal(sig, _handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:MAX_ERROR_LENGTH]


def _finish(
    calls: LeaseCalls, heartbeat: Heartbeat, lease: Lease, handler: Callable[[Lease], object], stats: ConsumeStats
) -> None:
    """Run the handler on one lease, then ack it, or nack it with the handler's exception."""
    failure: Exception | None = None
    try:
        handler(lease)
    except Exception as error:
        failure = error
    finally:
        # Before the ack or nack, so that no extend races it. False: the heartbeat found it lost.
        still_held = heartbeat.release(lease)
    if not still_held:
        return
    if isinstance(failure, Nack):
        _nack(calls, lease, failure, stats)
    elif failure is not None:
        log.warning("tickler handler failed on lease %s: %s", lease.lease_id, failure, exc_info=failure)
        _nack(calls, lease, Nack(error_text(failure)), stats)
    else:
        try:
            calls.ack(lease)
            stats.acked += 1
        except (StaleLease, TransportError, ServiceUnavailable) as error:
            stats.lost += 1
            log.warning("tickler lease %s not acked (%s); its events will be delivered again", lease.lease_id, error)


def _nack(calls: LeaseCalls, lease: Lease, nack: Nack, stats: ConsumeStats) -> None:
    try:
        calls.nack(lease, nack.error, retry_in_seconds=nack.retry_in_seconds, dead=nack.dead)
        stats.nacked += 1
    except (StaleLease, TransportError, ServiceUnavailable) as failure:
        stats.lost += 1
        log.warning("tickler lease %s not nacked (%s); it will expire", lease.lease_id, failure)


def run_consumer(
    calls: LeaseCalls,
    heartbeat_calls: LeaseCalls,
    queue: str,
    claim: Callable[[], list[Lease]],
    handler: Callable[[Lease], object],
    *,
    lease_seconds: float | None,
    stop: threading.Event,
    handle_signals: bool,
) -> ConsumeStats:
    """The loop behind `Client.consume` (documented there); `claim` long-polls `queue` for leases."""
    stats = ConsumeStats()
    with stop_on_signals(stop, handle_signals), Heartbeat(heartbeat_calls, stats, lease_seconds) as heartbeat:
        while not stop.is_set():
            try:
                leases = claim()
            except (TransportError, ServiceUnavailable) as error:
                log.warning("tickler claim on %s failed (%s); trying again", queue, error)
                stop.wait(OUTAGE_PAUSE)
                continue
            stats.claimed += len(leases)
            heartbeat.hold(leases)
            # Held leases are finished even after a stop: none is left to expire and cost an attempt.
            for lease in leases:
                _finish(calls, heartbeat, lease, handler, stats)
    return stats
