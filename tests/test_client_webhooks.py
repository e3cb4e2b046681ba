"""`verify_webhook`: a real dispatcher's delivery to the client's example receiver is verified,
and the check agrees with the stock `standardwebhooks` library on signed, tampered and stale
messages."""

from __future__ import annotations

import importlib.util
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook
from tickler_client import Client, WebhookDelivery, WebhookVerificationError, verify_webhook

from tests.helpers_http import serving_app
from tests.helpers_wait import wait_until
from tickler.scheduler.dispatcher import Dispatcher

EXAMPLE = Path(__file__).parent.parent / "clients" / "python" / "examples" / "webhook_receiver.py"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_receiver", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_receiver_verifies_a_real_delivery(admin: Client, webhook_dispatcher: Dispatcher) -> None:
    received: list[WebhookDelivery] = []
    holder: dict[str, str] = {}
    # The queue's secret exists only once the queue does, and the queue needs the receiver's URL.
    app = load_example().make_app  # built per request below, once the secret is known
    with serving_app(lambda environ, start: app(holder["secret"], received.append)(environ, start)) as base:
        queue = admin.put_queue("hooks", webhook_url=f"{base}/hooks")
        assert queue.signing_secret is not None and queue.signing_secret.startswith("whsec_")
        holder["secret"] = queue.signing_secret
        event = admin.schedule("hooks", "trial-ends:ana", {"plan": "pro"}, group_key="ana")
        wait_until(lambda: admin.get("hooks", "trial-ends:ana").status == "delivered", what="the delivery")
    [delivery] = received
    assert (delivery.queue, delivery.group_key) == ("hooks", "ana")
    assert [(e.id, e.item_key, e.data) for e in delivery.events] == [(event.id, "trial-ends:ana", {"plan": "pro"})]
    assert abs(delivery.timestamp - datetime.now(UTC)) < timedelta(minutes=1) and delivery.webhook_id


def test_a_receiver_with_the_wrong_secret_refuses_and_the_attempt_fails(
    admin: Client, webhook_dispatcher: Dispatcher
) -> None:
    received: list[WebhookDelivery] = []
    with serving_app(load_example().make_app(SECRET, received.append)) as base:
        admin.put_queue("hooks", webhook_url=f"{base}/hooks", backoff_initial_seconds=60)
        admin.schedule("hooks", "k")
        wait_until(lambda: admin.get("hooks", "k").redeliver_count == 1, what="a failed attempt")
    assert received == [] and admin.get("hooks", "k").last_error == "HTTP 401: "


def test_rotating_the_signing_secret_returns_a_new_one(admin: Client) -> None:
    first = admin.put_queue("hooks", webhook_url="http://127.0.0.1:9/hooks").signing_secret
    assert admin.put_queue("hooks", max_attempts=3).signing_secret is None  # shown only once
    rotated = admin.put_queue("hooks", rotate_signing_secret=True).signing_secret
    assert rotated is not None and first is not None and rotated != first and rotated.startswith("whsec_")


def signed(secret: str, body: bytes, *, at: datetime | None = None, msg_id: str = "msg_1") -> dict[str, str]:
    """Headers as the stock Standard Webhooks library signs them."""
    at = at or datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, at, body.decode())
    return {"Webhook-Id": msg_id, "Webhook-Timestamp": str(int(at.timestamp())), "Webhook-Signature": signature}


def delivery_body(**changes: Any) -> bytes:
    event = {
        "id": 7,
        "queue": "hooks",
        "item_key": "k",
        "group_key": None,
        "schedule_on": "2026-11-22T09:00:00Z",
        "data": {"a": 1},
        "status": "in_flight",
        "enqueued_on": "2026-11-22T08:00:00.123456Z",
        "enqueued_by": "signup",
        "dequeued_on": None,
        "dequeued_by": None,
        "claimed_on": "2026-11-22T09:00:00.5Z",
        "claimed_by": "w",
        "redeliver_count": 0,
        "max_attempts": 10,
        "last_error": None,
        "version": 2,
    }
    return json.dumps({"queue": "hooks", "group_key": None, "events": [{**event, **changes}]}).encode()


def test_verification_agrees_with_the_stock_library() -> None:
    body = delivery_body()
    headers = signed(SECRET, body)
    Webhook(SECRET).verify(body, {k.lower(): v for k, v in headers.items()})  # the stock check agrees
    delivery = verify_webhook(SECRET, headers, body)
    assert delivery.events[0].id == 7 and delivery.events[0].claimed_on == datetime(2026, 11, 22, 9, 0, 0, 500000, UTC)
    assert verify_webhook(SECRET, list(headers.items()), body.decode()).webhook_id == "msg_1"  # pairs and str
    # while rotating, the old and the new secret are both accepted
    assert verify_webhook(["whsec_" + "A" * 32, SECRET], headers, body).queue == "hooks"


@pytest.mark.parametrize(
    "tamper",
    ["body", "secret", "id", "stale", "future", "missing", "not-a-number"],
)
def test_verification_refuses(tamper: str) -> None:
    body = delivery_body()
    headers = signed(SECRET, body)
    secret = SECRET
    if tamper == "body":
        body = delivery_body(data={"a": 2})
    elif tamper == "secret":
        secret = "whsec_" + "B" * 32
    elif tamper == "id":
        headers["Webhook-Id"] = "msg_2"
    elif tamper == "stale":
        headers = signed(SECRET, body, at=datetime.now(UTC) - timedelta(minutes=6))
    elif tamper == "future":
        headers = signed(SECRET, body, at=datetime.now(UTC) + timedelta(minutes=6))
    elif tamper == "missing":
        del headers["Webhook-Signature"]
    else:
        headers["Webhook-Timestamp"] = "soon"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, headers, body)


def test_tolerance_is_adjustable() -> None:
    body = delivery_body()
    headers = signed(SECRET, body, at=datetime.fromtimestamp(time.time() - 600, UTC))
    assert verify_webhook(SECRET, headers, body, tolerance_seconds=3600).events[0].item_key == "k"
