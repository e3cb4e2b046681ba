"""Checking that a webhook request really comes from tickler (the Standard Webhooks scheme)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tickler_client.errors import WebhookVerificationError
from tickler_client.models import Event, parse_event

# How far the webhook-timestamp may be from this machine's clock (as the stock libraries allow).
DEFAULT_TOLERANCE_SECONDS = 300


@dataclass(frozen=True)
class WebhookDelivery:
    """A verified delivery: `events` are one event, or the due events of one group. `webhook_id`
    is the same on every retry of the same events — use it (or the events' ids) to de-duplicate."""

    webhook_id: str
    timestamp: datetime
    queue: str
    group_key: str | None
    events: list[Event]


def _lower(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return {str(name).lower(): str(value) for name, value in pairs}


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error as error:
        raise ValueError("a signing secret looks like whsec_<base64>") from error


def verify_webhook(
    secret: str | Iterable[str],
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes | str,
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
) -> WebhookDelivery:
    """Check a delivery's `webhook-signature` against the queue's signing secret and return it parsed.

    `secret` may be several secrets (while rotating, accept the old and the new). `headers` are
    the request's headers, any case; `body` the raw bytes as received (not re-encoded JSON).
    Raises `WebhookVerificationError` for a missing or wrong signature, or a timestamp further
    than `tolerance_seconds` from now (a replay).

    >>> delivery = verify_webhook(SECRET, request.headers, request.get_data())
    >>> for event in delivery.events:
    ...     handle(event.item_key, event.data)
    """
    found = _lower(headers)
    raw = body.encode() if isinstance(body, str) else body
    msg_id, stamp, signatures = (found.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not stamp or not signatures:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        sent = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a number of seconds") from None
    if abs(time.time() - sent) > tolerance_seconds:
        raise WebhookVerificationError("webhook-timestamp is too far from now (a replay, or a wrong clock)")
    secrets = [secret] if isinstance(secret, str) else list(secret)
    signed = f"{msg_id}.{stamp}.".encode() + raw
    expected = [base64.b64encode(hmac.new(_key(s), signed, hashlib.sha256).digest()) for s in secrets]
    offered = [sig.split(",", 1)[1].encode() for sig in signatures.split() if sig.startswith("v1,")]
    if not any(hmac.compare_digest(o, e) for o in offered for e in expected):
        raise WebhookVerificationError("no valid webhook-signature for this body and secret")
    try:
        payload: dict[str, Any] = json.loads(raw)
        events = [parse_event(e) for e in payload["events"]]
    except (ValueError, KeyError, TypeError) as error:
        raise WebhookVerificationError(f"signed, but not a tickler delivery: {error}") from error
    return WebhookDelivery(
        webhook_id=msg_id,
        timestamp=datetime.fromtimestamp(sent, UTC),
        queue=str(payload.get("queue", "")),
        group_key=payload.get("group_key"),
        events=events,
    )
