"""Webhook delivery: POST the lease's events, signed, to the queue's URL.

2xx: delivered. 410: dead (the receiver said stop). Anything else, a timeout or a refused
connection: a failed attempt, retried after the receiver's Retry-After when it sent one.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import threading
import time
from datetime import UTC, datetime

import requests

from scheduler.delivery import Dead, Delivered, Failed, Outcome
from scheduler.delivery.signing import signature_header
from scheduler.models import Lease, Queue, event_to_json

MAX_ERROR_LENGTH = 500


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


class WebhookDeliverer:
    """Sends with one HTTP session per delivery thread (connections are reused per receiver)."""

    def __init__(self, *, user_agent: str = "tickler") -> None:
        self._local = threading.local()
        self._user_agent = user_agent

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["User-Agent"] = self._user_agent
            self._local.session = session
        return session

    def deliver(self, queue: Queue, lease: Lease) -> Outcome:
        assert queue.webhook_url and queue.signing_secret
        body = json.dumps(
            {"queue": lease.queue, "group_key": lease.group_key, "events": [event_to_json(e) for e in lease.events]},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
        now = time.time()
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
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now)),
            "webhook-signature": signature_header(secrets, msg_id, int(now), body),
        }
        try:
            response = self._session().post(
                queue.webhook_url,
                data=body,
                headers=headers,
                timeout=queue.webhook_timeout_seconds,
                allow_redirects=False,
            )
        except requests.Timeout:
            return Failed(f"timed out after {queue.webhook_timeout_seconds} s")
        except requests.RequestException as error:
            return Failed(f"{type(error).__name__}: {error}"[:MAX_ERROR_LENGTH])
        if 200 <= response.status_code < 300:
            return Delivered()
        text = response.text[:200]
        if response.status_code == 410:
            return Dead(f"HTTP 410 Gone: {text}"[:MAX_ERROR_LENGTH])
        retry_in = retry_after_seconds(response.headers.get("Retry-After"), time.time())
        return Failed(f"HTTP {response.status_code}: {text}"[:MAX_ERROR_LENGTH], retry_in)
