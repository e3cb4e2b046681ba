"""Webhook delivery to a real local receiver that checks signatures with a stock verifier."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from datetime import timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from config import Settings
from scheduler.delivery.webhook import WebhookDeliverer, retry_after_seconds
from scheduler.dispatcher import Dispatcher, DispatcherConfig
from scheduler.models import NewEvent, Queue
from scheduler.store import QueueSettings, Store
from scheduler.wakeup import WakeupListener
from tests.helpers_wait import wait_until
from tests.receiver import Receiver, running_receiver


@pytest.fixture
def dispatcher(store: Store, database_url: str) -> Iterator[Dispatcher]:
    d = Dispatcher(
        store,
        WakeupListener(database_url),
        DispatcherConfig(worker_name="hooks-test", reap_interval=0.2),
        webhook=WebhookDeliverer(),
    ).start()
    yield d
    d.stop()


def webhook_queue(store: Store, receiver: Receiver, **settings: object) -> tuple[Queue, str]:
    result = store.queues.put(
        "hooks",
        QueueSettings(delivery_mode="webhook", webhook_url=receiver.url, backoff_initial_seconds=0.05, **settings),  # type: ignore[arg-type]
        Settings(),
    )
    assert result.new_signing_secret is not None
    return result.queue, result.new_signing_secret


def published_signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """The Standard Webhooks algorithm, written out from its specification."""
    key = base64.b64decode(secret.split("_", 1)[1])
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def test_delivery_is_signed_retried_after_500_and_ids_are_stable(store: Store, dispatcher: Dispatcher) -> None:
    with running_receiver([(500, {}), (200, {})]) as receiver:
        queue, secret = webhook_queue(store, receiver)
        store.events.schedule(queue, NewEvent(item_key="welcome:ana", data={"name": "Ana"}), actor="signup")
        first, second = receiver.wait_for(2)
        for delivery in (first, second):
            Webhook(secret).verify(delivery.body, delivery.headers)  # the stock verifier accepts it
            signatures = [s.split(",", 1)[1] for s in delivery.headers["webhook-signature"].split()]
            assert (
                published_signature(
                    secret, delivery.headers["webhook-id"], delivery.headers["webhook-timestamp"], delivery.body
                )
                in signatures
            )
        assert first.headers["webhook-id"] == second.headers["webhook-id"]
        body = second.json
        assert (body["queue"], body["group_key"]) == ("hooks", None)
        assert [e["item_key"] for e in body["events"]] == ["welcome:ana"]
        assert first.json["events"][0]["id"] == body["events"][0]["id"]
        wait_until(lambda: store.events.get("hooks", "welcome:ana").status == "delivered")
    event = store.events.get("hooks", "welcome:ana")
    assert (event.redeliver_count, event.last_error) == (1, "HTTP 500: ")
    actions = [t.action for t in store.events.timeline("hooks", "welcome:ana")]
    assert actions == ["enqueued", "claimed", "failed", "claimed", "delivered"]


def test_410_finishes_the_event_as_dead_without_retry(store: Store, dispatcher: Dispatcher) -> None:
    with running_receiver([(410, {})]) as receiver:
        queue, _ = webhook_queue(store, receiver)
        store.events.schedule(queue, NewEvent(item_key="gone", data={}), actor="signup")
        receiver.wait_for(1)
        wait_until(lambda: store.events.get("hooks", "gone").status == "dead")
        assert len(receiver.received) == 1
    assert store.events.timeline("hooks", "gone")[-1].details["reason"] == "receiver said stop"


def test_retry_after_is_honoured(store: Store, dispatcher: Dispatcher) -> None:
    with running_receiver([(503, {"Retry-After": "120"})]) as receiver:
        queue, _ = webhook_queue(store, receiver)
        store.events.schedule(queue, NewEvent(item_key="busy", data={}), actor="signup")
        receiver.wait_for(1)
        wait_until(lambda: store.events.get("hooks", "busy").redeliver_count == 1)
    failed = store.events.timeline("hooks", "busy")[-1]
    assert failed.action == "failed"
    assert failed.schedule_on is not None
    assert abs((failed.schedule_on - failed.at) - timedelta(seconds=120)) < timedelta(seconds=1)


def test_a_group_is_delivered_in_one_request(store: Store, dispatcher: Dispatcher) -> None:
    with running_receiver() as receiver:
        queue, secret = webhook_queue(store, receiver)
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"n{i}", group_key="ana@example.com", data={"i": i}) for i in range(3)],
            actor="billing",
        )
        [delivery] = receiver.wait_for(1)
        Webhook(secret).verify(delivery.body, delivery.headers)
        assert delivery.json["group_key"] == "ana@example.com"
        assert sorted(e["item_key"] for e in delivery.json["events"]) == ["n0", "n1", "n2"]


def test_unreachable_receiver_is_a_failed_attempt(store: Store, dispatcher: Dispatcher) -> None:
    with running_receiver() as receiver:
        url = receiver.url
    # the receiver is shut down: connections are refused
    store.queues.put(
        "hooks", QueueSettings(delivery_mode="webhook", webhook_url=url, backoff_initial_seconds=30), Settings()
    )
    store.events.schedule(store.queues.get("hooks"), NewEvent(item_key="k", data={}), actor="x")
    wait_until(lambda: store.events.get("hooks", "k").redeliver_count == 1)
    assert "ConnectionRefusedError" in (store.events.get("hooks", "k").last_error or "")


def test_rotated_secret_signs_beside_the_old_one(store: Store, dispatcher: Dispatcher) -> None:
    with running_receiver() as receiver:
        _, old_secret = webhook_queue(store, receiver)
        rotated = store.queues.put("hooks", QueueSettings(rotate_signing_secret=True), Settings())
        assert rotated.new_signing_secret and rotated.new_signing_secret != old_secret
        store.events.schedule(rotated.queue, NewEvent(item_key="k", data={}), actor="x")
        [delivery] = receiver.wait_for(1)
        Webhook(old_secret).verify(delivery.body, delivery.headers)
        Webhook(rotated.new_signing_secret).verify(delivery.body, delivery.headers)


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("30", 30.0), ("soon", None), ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0)],
)
def test_retry_after_parsing(header: str | None, expected: float | None) -> None:
    assert retry_after_seconds(header, now=1000.0) == expected
