"""Webhook delivery to a real local receiver that checks signatures with a stock verifier."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import timedelta

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.helpers_wait import wait_until
from tests.receiver import Received, Receiver, running_receiver
from tickler.config import Settings
from tickler.scheduler.delivery.webhook import retry_after_seconds
from tickler.scheduler.dispatcher import Dispatcher
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store


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


def test_delivery_is_signed_retried_after_500_and_ids_are_stable(store: Store, webhook_dispatcher: Dispatcher) -> None:
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


def test_410_finishes_the_event_as_dead_without_retry(store: Store, webhook_dispatcher: Dispatcher) -> None:
    with running_receiver([(410, {})]) as receiver:
        queue, _ = webhook_queue(store, receiver)
        store.events.schedule(queue, NewEvent(item_key="gone", data={}), actor="signup")
        receiver.wait_for(1)
        wait_until(lambda: store.events.get("hooks", "gone").status == "dead")
        assert len(receiver.received) == 1
    assert store.events.timeline("hooks", "gone")[-1].details["reason"] == "receiver said stop"


def test_retry_after_is_honoured(store: Store, webhook_dispatcher: Dispatcher) -> None:
    with running_receiver([(503, {"Retry-After": "120"})]) as receiver:
        queue, _ = webhook_queue(store, receiver)
        store.events.schedule(queue, NewEvent(item_key="busy", data={}), actor="signup")
        receiver.wait_for(1)
        wait_until(lambda: store.events.get("hooks", "busy").redeliver_count == 1)
    failed = store.events.timeline("hooks", "busy")[-1]
    assert failed.action == "failed"
    assert failed.schedule_on is not None
    assert abs((failed.schedule_on - failed.at) - timedelta(seconds=120)) < timedelta(seconds=1)


def test_retry_after_is_capped_at_the_queues_backoff_max(store: Store, webhook_dispatcher: Dispatcher) -> None:
    with running_receiver([(503, {"Retry-After": "999999999"})]) as receiver:
        webhook_queue(store, receiver, backoff_max_seconds=300)
        store.events.schedule(store.queues.get("hooks"), NewEvent(item_key="busy", data={}), actor="signup")
        receiver.wait_for(1)
        wait_until(lambda: store.events.get("hooks", "busy").redeliver_count == 1)
    failed = store.events.timeline("hooks", "busy")[-1]
    assert failed.action == "failed" and failed.schedule_on is not None
    assert abs((failed.schedule_on - failed.at) - timedelta(seconds=300)) < timedelta(seconds=1)


def test_a_410_counts_its_attempt(store: Store, webhook_dispatcher: Dispatcher) -> None:
    with running_receiver([(410, {})]) as receiver:
        queue, _ = webhook_queue(store, receiver)
        store.events.schedule(queue, NewEvent(item_key="gone", data={}), actor="signup")
        wait_until(lambda: store.events.get("hooks", "gone").status == "dead")
    event = store.events.get("hooks", "gone")
    assert event.redeliver_count == 1
    assert store.events.timeline("hooks", "gone")[-1].details["attempt"] == 1


def test_a_group_is_delivered_in_one_request(store: Store, webhook_dispatcher: Dispatcher) -> None:
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


def test_unreachable_receiver_is_a_failed_attempt(store: Store, webhook_dispatcher: Dispatcher) -> None:
    with running_receiver() as receiver:
        url = receiver.url
    # the receiver is shut down: connections are refused
    store.queues.put(
        "hooks", QueueSettings(delivery_mode="webhook", webhook_url=url, backoff_initial_seconds=30), Settings()
    )
    store.events.schedule(store.queues.get("hooks"), NewEvent(item_key="k", data={}), actor="x")
    wait_until(lambda: store.events.get("hooks", "k").redeliver_count == 1)
    assert "ConnectionRefusedError" in (store.events.get("hooks", "k").last_error or "")


def test_rotated_secret_signs_beside_the_old_one(store: Store, webhook_dispatcher: Dispatcher) -> None:
    with running_receiver() as receiver:
        _, old_secret = webhook_queue(store, receiver)
        rotated = store.queues.put("hooks", QueueSettings(rotate_signing_secret=True), Settings())
        new_secret = rotated.new_signing_secret
        assert new_secret and new_secret != old_secret
        # A running dispatcher hears of the rotation by NOTIFY, tens of milliseconds later: a delivery
        # claimed in between is signed with the old secret alone, which receivers still accept. Each
        # event is scheduled once the one before was delivered, until one carries the new signature.
        for n in range(1, 51):
            store.events.schedule(rotated.queue, NewEvent(item_key=f"k{n}", data={}), actor="x")
            delivery = receiver.wait_for(n)[-1]
            Webhook(old_secret).verify(delivery.body, delivery.headers)  # valid all through the rotation
            if signed_with(new_secret, delivery):
                break
        else:
            raise AssertionError("50 deliveries after the rotation, none signed with the new secret")
        assert len(delivery.headers["webhook-signature"].split()) == 2  # the new one beside the old one


def signed_with(secret: str, delivery: Received) -> bool:
    try:
        Webhook(secret).verify(delivery.body, delivery.headers)
    except WebhookVerificationError:
        return False
    return True


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("30", 30.0), ("soon", None), ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0)],
)
def test_retry_after_parsing(header: str | None, expected: float | None) -> None:
    assert retry_after_seconds(header, now=1000.0) == expected
