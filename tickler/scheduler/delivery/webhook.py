"""Webhook delivery: POST the lease's events, signed, to the queue's URL, on an event loop.

2xx: delivered. 410: dead (the receiver said stop). Anything else (a redirect included: never
followed), a timeout, a refused connection or a destination the policy refuses: a failed attempt,
retried after the receiver's Retry-After when it sent one.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from yarl import URL

from tickler.scheduler import tracing
from tickler.scheduler.delivery import Dead, Delivered, Failed, LeaseDeadline, LeaseEnded, Outcome
from tickler.scheduler.delivery.destinations import (
    CheckedResolver,
    DestinationDenied,
    DestinationPolicy,
    literal_address,
)
from tickler.scheduler.delivery.signing import signature_header
from tickler.scheduler.models import Lease, Queue
from tickler.scheduler.rules import event_to_json
from tickler.scheduler.tracing import TraceContext

MAX_ERROR_LENGTH = 500
# How much of a receiver's answer is read (the first 200 bytes go into last_error).
MAX_BODY_READ = 64 * 1024


def message_id(lease: Lease) -> str:
    """Stable across retries of the same events, so receivers can de-duplicate."""
    ids = sorted(e.id for e in lease.events)
    if len(ids) == 1:
        return f"msg_{lease.queue}_{ids[0]}"
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:24]
    return f"msg_{lease.queue}_g{digest}"


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


# Connections being opened at once, per receiver (scheme and host:port), per process, at first. A
# new connection waits in the receiver's accept queue until the receiver takes it; a plain server
# listens with a backlog of 5 (Python's socketserver), which holds 6, and a connection beyond that
# is dropped and retried by TCP 1 s later, then 3 s, or reset. A request on a new connection holds
# one of these until its answer comes or ACCEPT_WINDOW has passed since it connected (a receiver
# that accepts at all has taken it by then: a receiver slow to answer still gets 4 more
# connections every 50 ms). Requests on an open keep-alive connection never wait here. Each answer
# on a new connection that stays open adds one to the allowance (up to MAX_NEW_CONNECTIONS), so
# against a keep-alive receiver the pool grows like TCP's slow start, doubling every round trip;
# a receiver that closes every connection (HTTP/1.0) stays at 4 at a time.
NEW_CONNECTIONS_PER_RECEIVER = 4
MAX_NEW_CONNECTIONS = 1024
ACCEPT_WINDOW = 0.05


class _Gate:
    """One receiver's allowance of requests on new connections."""

    def __init__(self, permits: int) -> None:
        self.semaphore = asyncio.Semaphore(permits)
        self.permits = permits

    def grow(self) -> None:
        if self.permits < MAX_NEW_CONNECTIONS:
            self.permits += 1
            self.semaphore.release()  # an asyncio.Semaphore takes a release beyond its start: one more permit


def _trace_headers(lease: Lease) -> dict[str, str]:
    """The attempt's `traceparent` (tracing on: the current span); tracing off, a single event's
    producer context is handed on as it came, so the receiver still joins the producer's trace."""
    found = tracing.current_headers()
    if not found and len(lease.events) == 1:
        producer = TraceContext.of_row(lease.events[0])
        if producer is not None:
            found = producer.headers()
    return found


@dataclass
class _Request:
    """One request's state, seen by the connection hooks (aiohttp's trace_request_ctx)."""

    gate: _Gate
    deadline: asyncio.Timeout
    timeout: float
    lease_deadline: LeaseDeadline | None = None
    reused: bool = False
    opened: bool = False  # on a connection of its own
    gated: bool = False  # holding the gate's permit
    cut_at: float | None = None  # connecting: when the lease ends, before the request's own deadline
    resume_at: float | None = None  # the request's own deadline, once connected

    def check_lease(self) -> None:
        """Raise LeaseEnded when the lease's deadline has passed: the request must not go out."""
        if self.lease_deadline is not None and self.lease_deadline() <= asyncio.get_running_loop().time():
            raise LeaseEnded

    def ungate(self) -> None:
        """Give the gate's permit back (once)."""
        if self.gated:
            self.gated = False
            self.gate.semaphore.release()


class WebhookDeliverer:
    """Sends on one asyncio event loop, over a keep-alive connection pool per receiver.

    aiohttp, not httpx: against the same local receiver with 200 requests in flight, httpx's
    AsyncClient took ~20 times aiohttp's CPU per request, and one event loop carries every
    request of a worker (docs/architecture.md). Every method runs on the loop's thread.
    """

    def __init__(
        self,
        *,
        policy: DestinationPolicy | None = None,
        user_agent: str = "tickler",
        new_connections: int = NEW_CONNECTIONS_PER_RECEIVER,
        lookup: AbstractResolver | None = None,
        dns_cache_seconds: int | None = 10,
    ) -> None:
        """`lookup` resolves names in place of the system resolver (tests); a name's checked
        addresses are reused for `dns_cache_seconds` (None: resolved and checked anew for every
        new connection)."""
        self.policy = policy or DestinationPolicy()
        self._user_agent = user_agent
        self._new_connections = new_connections
        self._lookup = lookup
        self._dns_cache_seconds = dns_cache_seconds
        self._session: aiohttp.ClientSession | None = None
        self._gates: dict[tuple[str, str, int | None], _Gate] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            hooks = aiohttp.TraceConfig()
            hooks.on_connection_create_start.append(_new_connection)
            hooks.on_connection_create_end.append(_connected)
            hooks.on_connection_reuseconn.append(_reused_connection)
            connector = aiohttp.TCPConnector(
                limit=0,  # bounded by the dispatcher's count of requests in flight, not here
                resolver=CheckedResolver(self.policy, self._lookup),
                use_dns_cache=self._dns_cache_seconds is not None,
                ttl_dns_cache=self._dns_cache_seconds,  # the cache holds checked addresses only
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trace_configs=[hooks],
                trust_env=False,  # no proxy from the environment: the address checked is the one reached
                timeout=aiohttp.ClientTimeout(total=None),  # each request's own deadline, below
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _gate(self, url: URL) -> _Gate:
        """The receiver's allowance of requests on new connections (see NEW_CONNECTIONS_PER_RECEIVER)."""
        key = (url.scheme, url.host or "", url.port)
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(self._new_connections)
        return gate

    async def deliver(self, queue: Queue, lease: Lease, lease_deadline: LeaseDeadline | None = None) -> Outcome:
        """The request, checked against the lease's deadline before it goes out (before a
        connection is asked for, once one is made or reused): LeaseEnded when it has passed."""
        assert queue.webhook_url and queue.signing_secret and queue.webhook_timeout_seconds
        body = json.dumps(
            {"queue": lease.queue, "group_key": lease.group_key, "events": [event_to_json(e) for e in lease.events]},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
        now = int(time.time())
        secrets = [queue.signing_secret]
        if (
            queue.previous_signing_secret
            and queue.previous_secret_until
            and queue.previous_secret_until > datetime.now(UTC)
        ):
            secrets.append(queue.previous_signing_secret)
        msg_id = message_id(lease)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": self._user_agent,
            "webhook-id": msg_id,
            "webhook-timestamp": str(now),
            "webhook-signature": signature_header(secrets, msg_id, now, body),
            **_trace_headers(lease),
        }
        url = URL(queue.webhook_url, encoded=False)
        literal = literal_address(url.host or "")
        if literal is not None:  # the connector connects to an address literal without resolving it
            reason = self.policy.refusal(literal)
            if reason is not None:
                return Failed(reason)
        timeout = queue.webhook_timeout_seconds
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(None) as deadline:
                    state = _Request(self._gate(url), deadline, timeout, lease_deadline=lease_deadline)
                    state.check_lease()
                    deadline.reschedule(asyncio.get_running_loop().time() + timeout)
                    try:
                        async with self._client().post(
                            url, data=body, headers=headers, allow_redirects=False, trace_request_ctx=state
                        ) as response:
                            status = response.status
                            if state.opened and _keeps_alive(response):
                                state.gate.grow()  # it keeps connections open: it may have more at once
                            state.ungate()
                            text = await _read_start(response)
                            retry_after = response.headers.get("Retry-After")
                    finally:
                        state.ungate()
                break
            except DestinationDenied as denied:
                return Failed(str(denied)[:MAX_ERROR_LENGTH])
            except TimeoutError:
                if state.cut_at is not None:
                    raise LeaseEnded from None  # still connecting when the lease ended: nothing sent
                return Failed(f"timed out after {timeout} s")
            except aiohttp.ServerDisconnectedError as error:
                if state.reused and attempt == 1:
                    continue  # the receiver closed an idle keep-alive connection: once more, anew
                return Failed(f"{type(error).__name__}: {error}"[:MAX_ERROR_LENGTH])
            except aiohttp.ClientConnectorError as error:
                cause = error.os_error
                if isinstance(cause, DestinationDenied):
                    return Failed(str(cause)[:MAX_ERROR_LENGTH])
                return Failed(f"{type(cause).__name__}: {cause}"[:MAX_ERROR_LENGTH])
            except (OSError, aiohttp.ClientError) as error:
                return Failed(f"{type(error).__name__}: {error}"[:MAX_ERROR_LENGTH])
        if 200 <= status < 300:
            return Delivered()
        summary = f"HTTP {status}: {text[:200].decode('utf-8', 'replace')}"[:MAX_ERROR_LENGTH]
        if status == 410:
            return Dead(summary.replace("HTTP 410:", "HTTP 410 Gone:", 1))
        retry_in = retry_after_seconds(retry_after, time.time())
        if retry_in is not None:
            # A receiver's Retry-After never parks an event longer than the queue's own backoff would.
            retry_in = min(retry_in, queue.backoff_max_seconds)
        return Failed(summary, retry_in)


def _keeps_alive(response: aiohttp.ClientResponse) -> bool:
    """Whether the receiver keeps this connection open for the next request (HTTP/1.1 unless it
    says close; HTTP/1.0 only when it says keep-alive)."""
    said = response.headers.get("Connection", "").lower()
    version = response.version or aiohttp.HttpVersion10
    return said == "keep-alive" or (version >= aiohttp.HttpVersion11 and said != "close")


async def _read_start(response: aiohttp.ClientResponse) -> bytes:
    """Up to MAX_BODY_READ bytes of the answer; a longer answer's connection is not reused."""
    text = b""
    while len(text) < MAX_BODY_READ:
        chunk = await response.content.read(MAX_BODY_READ - len(text))
        if not chunk:
            return text
        text += chunk
    if not response.content.at_eof():
        response.close()
    return text


async def _new_connection(session: Any, context: SimpleNamespace, params: Any) -> None:
    """A request about to open a connection: it waits for the receiver's gate, and its deadline
    starts once it holds it (waiting for the gate is not the receiver being slow)."""
    state = context.trace_request_ctx
    if isinstance(state, _Request) and not state.gated:
        state.deadline.reschedule(None)
        await state.gate.semaphore.acquire()
        state.opened = state.gated = True
        state.check_lease()
        now = asyncio.get_running_loop().time()
        ends = now + state.timeout
        if state.lease_deadline is not None and state.lease_deadline() < ends:
            # Connecting may not outlast the lease (a receiver slow to accept): past it, the
            # request is not sent (LeaseEnded); the request's own deadline comes back once connected.
            state.cut_at, state.resume_at = state.lease_deadline(), ends
            state.deadline.reschedule(state.cut_at)
            return
        state.deadline.reschedule(ends)


async def _connected(session: Any, context: SimpleNamespace, params: Any) -> None:
    """The new connection is made: its permit goes back after ACCEPT_WINDOW, answered or not."""
    state = context.trace_request_ctx
    if isinstance(state, _Request) and state.resume_at is not None:
        state.deadline.reschedule(state.resume_at)
        state.cut_at = state.resume_at = None
    if isinstance(state, _Request) and state.gated:
        asyncio.get_running_loop().call_later(ACCEPT_WINDOW, state.ungate)


async def _reused_connection(session: Any, context: SimpleNamespace, params: Any) -> None:
    state = context.trace_request_ctx
    if isinstance(state, _Request):
        state.reused = True
        state.check_lease()  # aiohttp gives the connection back to the pool
