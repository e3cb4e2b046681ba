"""Webhook delivery: POST the lease's events, signed, to the queue's URL.

2xx: delivered. 410: dead (the receiver said stop). Anything else, a timeout or a refused
connection: a failed attempt, retried after the receiver's Retry-After when it sent one.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import threading
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

from tickler.scheduler import tracing
from tickler.scheduler.delivery import Dead, Delivered, Failed, Outcome
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


# Requests on a new connection in progress at once, per receiver (scheme and host:port), per
# process. A new connection waits in the receiver's accept queue until the receiver takes it;
# a plain server listens with a backlog of 5 (Python's socketserver), which holds 6, and a
# connection beyond that is dropped and retried by TCP 1 s later, then 3 s, or reset. Requests
# on an open keep-alive connection never wait here: against a capable receiver the connections
# open 4 at a time (a ramp of a few milliseconds) and are then reused without limit.
NEW_CONNECTIONS_PER_RECEIVER = 4


def _trace_headers(lease: Lease) -> dict[str, str]:
    """The attempt's `traceparent` (tracing on: the current span); tracing off, a single event's
    producer context is handed on as it came, so the receiver still joins the producer's trace."""
    found = tracing.current_headers()
    if not found and len(lease.events) == 1:
        producer = TraceContext.of_row(lease.events[0])
        if producer is not None:
            found = producer.headers()
    return found


class WebhookDeliverer:
    """Sends over one keep-alive connection per receiver and delivery thread.

    Plain http.client, not requests: requests spends ~0.6 ms of CPU per call on top, which under
    the GIL caps a worker's deliveries per second well below what its receivers can take.
    """

    def __init__(self, *, user_agent: str = "tickler", new_connections: int = NEW_CONNECTIONS_PER_RECEIVER) -> None:
        self._local = threading.local()
        self._user_agent = user_agent
        self._new_connections = new_connections
        self._gates: dict[tuple[str, str], threading.BoundedSemaphore] = {}
        self._gates_lock = threading.Lock()

    def _gate(self, scheme: str, netloc: str) -> threading.BoundedSemaphore:
        """The receiver's limit of requests on new connections (see NEW_CONNECTIONS_PER_RECEIVER)."""
        with self._gates_lock:
            gate = self._gates.get((scheme, netloc))
            if gate is None:
                gate = self._gates[(scheme, netloc)] = threading.BoundedSemaphore(self._new_connections)
            return gate

    def _connection(self, scheme: str, netloc: str, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """The thread's connection to this receiver (and whether it was used before)."""
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        found = pool.get((scheme, netloc))
        if found is not None:
            found.timeout = timeout
            return found, True
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        connection = cls(netloc, timeout=timeout)
        pool[(scheme, netloc)] = connection
        return connection, False

    def _forget(self, scheme: str, netloc: str) -> None:
        connection = self._local.__dict__.get("pool", {}).pop((scheme, netloc), None)
        if connection is not None:
            connection.close()

    def deliver(self, queue: Queue, lease: Lease) -> Outcome:
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
        url = urlsplit(queue.webhook_url)
        target = url.path or "/"
        if url.query:
            target += "?" + url.query
        for attempt in (1, 2):
            connection, reused = self._connection(url.scheme, url.netloc, queue.webhook_timeout_seconds)
            # http.client opens a new socket by itself when the last answer closed the old one
            # (HTTP/1.0, "Connection: close"): that request needs the receiver to accept anew.
            gate = self._gate(url.scheme, url.netloc) if connection.sock is None else None
            if gate is not None:
                gate.acquire()
            try:
                connection.request("POST", target, body=body, headers=headers)
                response = connection.getresponse()
                text = response.read(MAX_BODY_READ)
                if not response.isclosed():  # an answer too long to read: do not reuse the connection
                    self._forget(url.scheme, url.netloc)
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as error:
                self._forget(url.scheme, url.netloc)
                if reused and gate is None and attempt == 1:
                    continue  # the receiver closed an idle keep-alive connection: once more, anew
                return Failed(f"{type(error).__name__}: {error}"[:MAX_ERROR_LENGTH])
            except TimeoutError:
                self._forget(url.scheme, url.netloc)
                return Failed(f"timed out after {queue.webhook_timeout_seconds} s")
            except (OSError, http.client.HTTPException) as error:
                self._forget(url.scheme, url.netloc)
                return Failed(f"{type(error).__name__}: {error}"[:MAX_ERROR_LENGTH])
            finally:
                if gate is not None:
                    gate.release()
        status = response.status
        if 200 <= status < 300:
            return Delivered()
        summary = f"HTTP {status}: {text[:200].decode('utf-8', 'replace')}"[:MAX_ERROR_LENGTH]
        if status == 410:
            return Dead(summary.replace("HTTP 410:", "HTTP 410 Gone:", 1))
        retry_in = retry_after_seconds(response.getheader("Retry-After"), time.time())
        if retry_in is not None:
            # A receiver's Retry-After never parks an event longer than the queue's own backoff would.
            retry_in = min(retry_in, queue.backoff_max_seconds)
        return Failed(summary, retry_in)
