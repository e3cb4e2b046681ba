"""The Python client as a pull consumer, against the real server: claim, ack, nack, extend and
the fencing of stale leases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest
from tickler_client import Client, Lease, NackResult, StaleLease


def test_claim_and_ack(tickler: Client) -> None:
    tickler.schedule("emails", "welcome:ana", {"n": 1})
    [lease] = tickler.claim("emails", worker="mailer-1", limit=10)
    assert isinstance(lease, Lease) and isinstance(lease.expires_at, datetime) and lease.group_key is None
    [event] = lease.events
    assert (event.item_key, event.status, event.claimed_by) == ("welcome:ana", "in_flight", "signup-service/mailer-1")
    assert 25 < lease.lease_seconds <= 30  # the queue's default lease, read from server times
    tickler.ack(lease)
    done = tickler.get("emails", "welcome:ana")
    assert (done.status, done.dequeued_by) == ("delivered", "signup-service/mailer-1")
    with pytest.raises(StaleLease) as caught:
        tickler.ack(lease.lease_id)  # an id works as well as the Lease
    assert caught.value.status == 409
    assert tickler.claim("emails", worker="mailer-1") == []


def test_a_group_is_one_lease(tickler: Client) -> None:
    for i in range(3):
        tickler.schedule("emails", f"n{i}", group_key="ana@example.com")
    [lease] = tickler.claim("emails", worker="w", limit=5)
    assert lease.group_key == "ana@example.com" and sorted(e.item_key for e in lease.events) == ["n0", "n1", "n2"]


def test_long_poll_returns_an_event_scheduled_meanwhile(tickler: Client, live_server: str, token: str) -> None:
    import threading

    got: list[list[Lease]] = []
    with Client(live_server, token) as waiting:
        poller = threading.Thread(target=lambda: got.append(waiting.claim("emails", worker="w", wait_seconds=15)))
        poller.start()
        tickler.schedule("emails", "late")
        poller.join(timeout=20)
    assert [[e.item_key for e in lease.events] for lease in got[0]] == [["late"]]


def test_nack_retries_then_dead(tickler: Client, admin: Client) -> None:
    admin.put_queue("emails", max_attempts=2)
    tickler.schedule("emails", "k")
    [lease] = tickler.claim("emails", worker="w")
    result = tickler.nack(lease, "smtp down", retry_in_seconds=0)
    assert isinstance(result, NackResult)
    assert (result.status, result.retrying, result.dead) == ("retrying", 1, 0)
    assert isinstance(result.retry_at, datetime)
    [lease] = tickler.claim("emails", worker="w")
    assert lease.events[0].redeliver_count == 1
    assert tickler.nack(lease, "still down").status == "dead"
    event = tickler.get("emails", "k")
    assert (event.status, event.last_error) == ("dead", "still down")
    with pytest.raises(StaleLease):
        tickler.nack(lease, "again")


def test_nack_dead_finishes_at_once(tickler: Client) -> None:
    tickler.schedule("emails", "k")
    [lease] = tickler.claim("emails", worker="w")
    assert tickler.nack(lease, "address gone", dead=True).dead == 1
    assert tickler.get("emails", "k").status == "dead"


def test_extend_moves_the_expiry_and_a_stale_lease_cannot_be_extended(
    tickler: Client, raw: psycopg.Connection[Any]
) -> None:
    tickler.schedule("emails", "k")
    [lease] = tickler.claim("emails", worker="w", lease_seconds=5)
    assert 4 < lease.lease_seconds <= 5
    extended = tickler.extend(lease, 600)
    assert isinstance(extended, Lease) and (extended.lease_id, extended.events) == (lease.lease_id, lease.events)
    assert (extended.expires_at - lease.expires_at).total_seconds() > 500
    stored = raw.execute("SELECT lease_expires_on FROM tickler_event WHERE item_key = 'k'").fetchone()
    assert stored is not None and stored[0] == extended.expires_at
    by_id = tickler.extend(lease.lease_id, 600)  # an id alone: the lease's id and new expiry
    assert (by_id.lease_id, by_id.events) == (lease.lease_id, []) and by_id.expires_at >= extended.expires_at
    tickler.ack(lease)
    with pytest.raises(StaleLease):
        tickler.extend(lease, 60)
    with pytest.raises(StaleLease):
        tickler.ack("not-a-uuid")


def test_ack_many_reports_the_stale_ones(tickler: Client) -> None:
    for key in ("a", "b", "c"):
        tickler.schedule("emails", key)
    leases = tickler.claim("emails", worker="w", limit=3)
    tickler.ack(leases[0])
    assert tickler.ack_many(leases) == [leases[0].lease_id]
    assert {e.status for e in tickler.search("emails")} == {"delivered"}
