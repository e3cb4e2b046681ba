"""A lease whose time is up is over, whether or not the reaper has ended it yet: every entry point
treats such an event as the reaper would leave it. Each test runs the same step on two events whose
leases expired — one reaped first ("reaped"), one that no reaper touched ("unreaped") — and
expects the same outcome, timeline and counters for both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from tests.conftest import auth
from tickler.scheduler.errors import NotFound, StaleLease
from tickler.scheduler.models import Lease, NewEvent, Queue
from tickler.scheduler.states import OnConflict
from tickler.scheduler.store import Matching, Store
from tickler.scheduler.store.events import EventChanges

KEYS = ("reaped", "unreaped")


def expired_total() -> float:
    """tickler_leases_expired_total of the queue: leases ended by the reaper or by a claim."""
    return REGISTRY.get_sample_value("tickler_leases_expired_total", {"queue": "emails"}) or 0.0


def expire(raw: psycopg.Connection[Any], item_key: str) -> None:
    """Move the lease of `item_key`'s open event into the past, as if its holder had gone away."""
    done = raw.execute(
        "UPDATE tickler_event SET lease_expires_on = now() - interval '1 second'"
        " WHERE queue = 'emails' AND item_key = %s AND dequeued_on IS NULL AND lease_id IS NOT NULL",
        [item_key],
    )
    assert done.rowcount >= 1


def expire_both(store: Store, raw: psycopg.Connection[Any]) -> None:
    """Expire both leases; the reaper ends only the first (it runs before the second expires)."""
    expire(raw, "reaped")
    assert store.leases.expire() == {"emails": 1}
    expire(raw, "unreaped")


def leased_pair(
    store: Store,
    make_queue: Callable[..., Queue],
    raw: psycopg.Connection[Any],
    *,
    grouped: bool = False,
    **settings: Any,
) -> tuple[Queue, list[Lease]]:
    """Both keys scheduled, claimed by "w1", and expired (one reaped, one not)."""
    queue = make_queue("emails", **settings)
    for key in KEYS:
        store.events.schedule(
            queue, NewEvent(item_key=key, data={"n": 1}, group_key=f"g-{key}" if grouped else None), actor="test"
        )
    leases = store.leases.claim(queue, worker="w1", limit=10)
    assert sorted(e.item_key for lease in leases for e in lease.events) == sorted(KEYS)
    expire_both(store, raw)
    return queue, leases


def state(store: Store, item_key: str) -> tuple[Any, ...]:
    """What a reader sees of a key: its event's status and counters, and its timeline."""
    event = store.events.get("emails", item_key)
    timeline = store.events.timeline("emails", item_key)
    expired = [t.details for t in timeline if t.action == "lease_expired"]
    return (
        event.status,
        event.redeliver_count,
        event.last_error,
        event.dequeued_by,
        [(t.action, t.actor) for t in timeline],
        [sorted(details) for details in expired],
    )


def assert_same(store: Store, *expected_actions: str) -> tuple[Any, ...]:
    reaped, unreaped = (state(store, key) for key in KEYS)
    assert unreaped == reaped
    assert [action for action, _ in unreaped[4]] == list(expected_actions)
    return unreaped


def test_a_claim_takes_the_event_and_counts_the_expired_attempt(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw)
    before = expired_total()
    leases = store.leases.claim(queue, worker="w2", limit=10)
    assert expired_total() == before + 1  # counted as the reaper counts the lease it ends
    assert sorted(e.item_key for lease in leases for e in lease.events) == sorted(KEYS)
    assert {e.redeliver_count for lease in leases for e in lease.events} == {1}
    status, redelivered, error, _, actions, details = assert_same(
        store, "enqueued", "claimed", "lease_expired", "claimed"
    )
    assert (status, redelivered, error) == ("in_flight", 1, "lease expired")
    assert actions[2] == ("lease_expired", "tickler") and details == [["claimed_by", "expired_at", "lease_id"]]


def test_a_claim_of_an_event_on_its_last_attempt_ends_it_dead(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw, max_attempts=1)
    before = expired_total()
    assert store.leases.claim(queue, worker="w2", limit=10) == []
    assert expired_total() == before + 1
    status, redelivered, _, dequeued_by, _, _ = assert_same(store, "enqueued", "claimed", "lease_expired", "dead")
    assert (status, redelivered, dequeued_by) == ("dead", 1, "tickler")


def test_a_claim_takes_at_most_its_limit(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw)
    [first] = store.leases.claim(queue, worker="w2", limit=1)
    [second] = store.leases.claim(queue, worker="w2", limit=1)
    assert {first.events[0].item_key, second.events[0].item_key} == set(KEYS)


def test_a_group_claim_takes_the_group_again(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw, grouped=True)
    before = expired_total()
    leases = store.leases.claim(queue, worker="w2", limit=10)
    assert expired_total() == before + 1
    assert sorted(lease.group_key or "" for lease in leases) == ["g-reaped", "g-unreaped"]
    status, redelivered, error, _, _, _ = assert_same(store, "enqueued", "claimed", "lease_expired", "claimed")
    assert (status, redelivered, error) == ("in_flight", 1, "lease expired")


def test_a_limited_queue_claims_it_under_its_flow_lock(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw, max_in_flight=5)
    leases = store.leases.claim(queue, worker="w2", limit=10)
    assert len(leases) == 2
    assert_same(store, "enqueued", "claimed", "lease_expired", "claimed")


def test_a_pull_claim_over_http_takes_it(
    client: FlaskClient, emails: str, token: str, store: Store, raw: psycopg.Connection[Any]
) -> None:
    for key in KEYS:
        body = {"item_key": key, "data": {}}
        assert client.post("/v1/queues/emails/events", json=body, headers=auth(token)).status_code == 202
    claims = client.post("/v1/queues/emails/claims", json={"worker": "w1", "limit": 10}, headers=auth(token))
    old = claims.json["leases"]
    expire_both(store, raw)
    claims = client.post("/v1/queues/emails/claims", json={"worker": "w2", "limit": 10}, headers=auth(token))
    assert claims.status_code == 200
    assert sorted(e["item_key"] for lease in claims.json["leases"] for e in lease["events"]) == sorted(KEYS)
    assert_same(store, "enqueued", "claimed", "lease_expired", "claimed")
    for lease in old:  # the first holders' leases stay over
        for action in ("ack", "extend", "nack"):
            body = {"seconds": 10} if action == "extend" else {"error": "late"}
            response = client.post(f"/v1/leases/{lease['lease_id']}/{action}", json=body, headers=auth(token))
            assert response.status_code == 409


@pytest.mark.parametrize("on_conflict", [OnConflict.REPLACE, OnConflict.DEBOUNCE])
def test_replace_and_debounce_by_key_change_it(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], on_conflict: str
) -> None:
    queue, _ = leased_pair(store, make_queue, raw)
    for key in KEYS:
        event, outcome = store.events.schedule(
            queue, NewEvent(item_key=key, data={"n": 2}, delay_seconds=60), actor="test", on_conflict=on_conflict
        )
        assert (outcome, event.data, event.status) == (f"{on_conflict}d", {"n": 2}, "pending")
    status, redelivered, error, _, _, _ = assert_same(store, "enqueued", "claimed", "lease_expired", f"{on_conflict}d")
    assert (status, redelivered, error) == ("pending", 1, "lease expired")


def test_a_batch_replace_changes_them(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw)
    results = store.events.schedule_batch(
        queue, [NewEvent(item_key=key, data={"n": 2}) for key in KEYS], actor="test", on_conflict=OnConflict.REPLACE
    )
    assert [r.outcome for r in results] == ["replaced", "replaced"]
    assert_same(store, "enqueued", "claimed", "lease_expired", "replaced")


def test_a_replace_on_the_last_attempt_finds_the_key_free(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, _ = leased_pair(store, make_queue, raw, max_attempts=1)
    for key in KEYS:
        _, outcome = store.events.schedule(
            queue, NewEvent(item_key=key, data={}), actor="test", on_conflict=OnConflict.REPLACE
        )
        assert outcome == "created"
    assert_same(store, "enqueued", "claimed", "lease_expired", "dead", "enqueued")


def test_reschedule_by_key_changes_it(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    leased_pair(store, make_queue, raw)
    for key in KEYS:
        changed = store.events.change("emails", key, EventChanges(delay_seconds=60), actor="test")
        assert changed.status == "pending"
    assert_same(store, "enqueued", "claimed", "lease_expired", "rescheduled")


def test_cancel_by_key_cancels_it(store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]) -> None:
    leased_pair(store, make_queue, raw)
    for key in KEYS:
        assert store.events.cancel("emails", key, actor="test").status == "cancelled"
    status, redelivered, _, dequeued_by, _, _ = assert_same(store, "enqueued", "claimed", "lease_expired", "cancelled")
    assert (status, redelivered, dequeued_by) == ("cancelled", 1, "test")


def test_cancel_by_key_on_the_last_attempt_finds_it_dead(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    leased_pair(store, make_queue, raw, max_attempts=1)
    for key in KEYS:
        with pytest.raises(NotFound):
            store.events.cancel("emails", key, actor="test")
    assert assert_same(store, "enqueued", "claimed", "lease_expired", "dead")[0] == "dead"


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_cancel_by_filter_cancels_it(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], max_attempts: int
) -> None:
    leased_pair(store, make_queue, raw, max_attempts=max_attempts)
    cancelled = store.events.cancel_matching("emails", Matching(item_key_prefix=""), actor="test")
    last = "cancelled" if max_attempts > 1 else "dead"
    assert cancelled == (2 if max_attempts > 1 else 0)
    assert assert_same(store, "enqueued", "claimed", "lease_expired", last)[0] == last


def test_the_stale_holder_cannot_finish_it(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, leases = leased_pair(store, make_queue, raw)
    for lease in leases:
        with pytest.raises(StaleLease):
            store.leases.ack_one(lease.lease_id)
        with pytest.raises(StaleLease):
            store.leases.nack(lease.lease_id, error="late")
        with pytest.raises(StaleLease):
            store.leases.extend(lease.lease_id, seconds=30)
    assert store.leases.release([lease.lease_id for lease in leases], actor="w1") == 0
    # refused, and nothing written: the unreaped lease is still for the reaper (or a claim) to end
    assert [a for a, _ in state(store, "unreaped")[4]] == ["enqueued", "claimed"]
    assert store.leases.expire() == {"emails": 1}
    assert_same(store, "enqueued", "claimed", "lease_expired")
    assert len(store.leases.claim(queue, worker="w2", limit=10)) == 2
