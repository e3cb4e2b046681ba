"""The blocking client: one object per tickler server and token."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

from tickler_client import _erasures, _events, _leases, _queues, _tokens
from tickler_client._bind import Sends, blocking, blocking_pages
from tickler_client._http import Transport
from tickler_client.consume import ConsumeStats, default_worker_name, run_consumer
from tickler_client.errors import StaleLease, TicklerError
from tickler_client.models import Lease, NackResult, Schedule


class _LeaseCalls(Sends):
    """The lease calls alone, over a transport of their own (the consumer's heartbeat thread)."""

    claim = blocking(_leases.claim)
    ack = blocking(_leases.ack)
    nack = blocking(_leases.nack)
    extend = blocking(_leases.extend)

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def close(self) -> None:
        self._transport.close()


class Client(Sends):
    """A tickler server, reached with one token. Safe to share between threads (one pool of
    keep-alive connections); cheap to create; close it, or use it as a context manager.

    `connect_timeout` bounds connecting (default 5 s) and `read_timeout` waiting for each answer
    (default 30 s; a long-polling claim waits longer by its `wait_seconds`); `timeout` sets both
    at once. Calls that are safe to repeat (each method's docstring says) are retried up to
    `retries` times after no answer or a 503, waiting `retry_backoff * 2**n` seconds or the
    server's `Retry-After`; every other call raises at once. A naive datetime argument raises
    `ValidationError` before any request.

    >>> with Client("http://127.0.0.1:8080", token) as client:
    ...     client.schedule("emails", "welcome:ana@example.com", {"template": "welcome"}, delay=86400)
    """

    # events
    schedule = blocking(_events.schedule)
    schedule_batch = blocking(_events.schedule_batch)
    reschedule = blocking(_events.reschedule)
    cancel = blocking(_events.cancel)
    cancel_matching = blocking(_events.cancel_matching)
    get = blocking(_events.get)
    timeline = blocking(_events.timeline)
    search_page = blocking(_events.search_page)
    search = blocking_pages(_events.search)
    retry = blocking(_events.retry)
    retry_matching = blocking(_events.retry_matching)
    # pull consumers
    claim = blocking(_leases.claim)
    ack_many = blocking(_leases.ack_many)
    extend = blocking(_leases.extend)
    # queues (admin) and recurring schedules
    put_queue = blocking(_queues.put_queue)
    get_queue = blocking(_queues.get_queue)
    list_queues = blocking(_queues.list_queues)
    pause_queue = blocking(_queues.pause_queue)
    resume_queue = blocking(_queues.resume_queue)
    delete_queue = blocking(_queues.delete_queue)
    put_schedule = blocking(_queues.put_schedule)
    get_schedule = blocking(_queues.get_schedule)
    delete_schedule = blocking(_queues.delete_schedule)
    # tokens (admin)
    create_token = blocking(_tokens.create_token)
    list_tokens = blocking(_tokens.list_tokens)
    revoke_token = blocking(_tokens.revoke_token)

    # erasures (admin)
    erase = blocking(_erasures.erase)
    erasure = blocking(_erasures.erasure)
    erasures = blocking(_erasures.erasures)

    def ack(self, lease: Lease | str) -> None:
        with self._explaining(lease):
            self._transport.send(_leases.ack(lease))

    def nack(
        self, lease: Lease | str, error: str, *, retry_in_seconds: float | None = None, dead: bool = False
    ) -> NackResult:
        with self._explaining(lease):
            return self._transport.send(_leases.nack(lease, error, retry_in_seconds=retry_in_seconds, dead=dead))

    ack.__doc__, nack.__doc__ = _leases.ack.__doc__, _leases.nack.__doc__

    @contextlib.contextmanager
    def _explaining(self, lease: Lease | str) -> Iterator[None]:
        """A StaleLease the server could not explain is completed from the key's timeline."""
        try:
            yield
        except StaleLease as stale:
            key = _leases.key_of(lease)
            if stale.lease_status == "unknown" and key is not None:
                with contextlib.suppress(TicklerError):
                    _leases.explain(stale, lease, self.timeline(*key))
            raise

    def list_schedules(self, queue: str, *, page_size: int = 100) -> list[Schedule]:
        """Every schedule of a queue, ordered by key (all pages, `page_size` each). Retried.

        >>> [s.schedule_key for s in client.list_schedules("reports")]
        ['daily-digest']
        """
        return list(self._every(_queues.schedules(queue, page_size=page_size)))

    def consume(
        self,
        queue: str,
        handler: Callable[[Lease], object],
        *,
        worker: str | None = None,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 10.0,
        stop: threading.Event | None = None,
        handle_signals: bool = True,
    ) -> ConsumeStats:
        """Run a pull consumer until `stop` is set or SIGINT/SIGTERM arrives; returns its counts.

        Long-polls for up to `limit` leases at a time and calls `handler(lease)` for each, one
        after the other: returning acks the lease, raising nacks it with the exception as the
        error (raise `Nack(...)` to choose `retry_in_seconds` or `dead`). While leases are held
        a heartbeat thread extends them every half lease, so a slow handler is not delivered
        twice. On a stop the loop finishes the leases it holds (none is left to expire), then
        returns; a long poll in progress ends first (up to `wait_seconds`). Signal handlers are
        installed only when called from the main thread. A 503 or no answer from the server is
        logged and the loop tries again after a pause; other errors (401, 404) are raised.

        >>> def send(lease: Lease) -> None:
        ...     for event in lease.events:
        ...         mailer.send(event.data)
        >>> client.consume("emails", send, worker="mailer-1")
        ConsumeStats(claimed=..., acked=..., nacked=..., extended=..., lost=0)
        """
        name = worker or default_worker_name()

        def claim() -> list[Lease]:
            return self.claim(queue, worker=name, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds)

        # The heartbeat thread gets connections of its own: an extend never waits behind a long poll.
        heartbeat_calls = _LeaseCalls(self._transport.clone())
        try:
            return run_consumer(
                self,
                heartbeat_calls,
                queue,
                claim,
                handler,
                lease_seconds=lease_seconds,
                stop=stop or threading.Event(),
                handle_signals=handle_signals,
            )
        finally:
            heartbeat_calls.close()

    def close(self) -> None:
        """Close the HTTP connections (also done on leaving a `with` block)."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
