"""The Python client's operations calls against the real server: retry dead events, pause and
resume a queue, flow-control settings, delete a queue, list queues, manage tokens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from tickler_client import (
    Client,
    Conflict,
    DeletedQueue,
    Forbidden,
    NotFound,
    Queue,
    Token,
    Unauthorized,
    ValidationError,
)

from tests.client_fixtures import MakeClient


def dead(client: Client, key: str, group_key: str | None = None) -> None:
    """Schedule `key` and finish it `dead` through a pull consumer's nack."""
    client.schedule("emails", key, group_key=group_key)
    for lease in client.claim("emails", worker="w", limit=10):
        client.nack(lease, "gone", dead=True)


def test_retry_opens_a_dead_event_again(tickler: Client) -> None:
    dead(tickler, "k")
    before = tickler.get("emails", "k")
    retried = tickler.retry("emails", "k", delay=timedelta(minutes=10))
    assert (retried.id, retried.status) == (before.id, "pending")
    assert retried.version > before.version and retried.max_attempts > retried.redeliver_count
    assert timedelta(minutes=9) < retried.schedule_on - datetime.now(UTC) < timedelta(minutes=11)
    entry = tickler.timeline("emails", "k").entries[-1]
    assert (entry.action, entry.actor) == ("retried", "signup-service")
    with pytest.raises(Conflict) as caught:  # the key has an open event now
        tickler.retry("emails", "k")
    assert caught.value.event is not None and caught.value.event.id == before.id
    with pytest.raises(NotFound):
        tickler.retry("emails", "never-seen")
    tickler.cancel("emails", "k")
    with pytest.raises(NotFound):  # its most recent event is cancelled, not dead
        tickler.retry("emails", "k")


def test_retry_matching_by_prefix_or_group(tickler: Client) -> None:
    dead(tickler, "welcome:a")
    dead(tickler, "welcome:b")
    dead(tickler, "digest:a", group_key="ana")
    assert tickler.retry_matching("emails", item_key_prefix="welcome:") == 2
    assert tickler.retry_matching("emails", group_key="ana") == 1
    assert tickler.retry_matching("emails", group_key="ana") == 0
    assert {e.status for e in tickler.search("emails")} == {"pending"}
    with pytest.raises(ValidationError):
        tickler.retry_matching("emails")


def test_pause_and_resume(admin: Client, tickler: Client) -> None:
    tickler.schedule("emails", "k")
    paused = admin.pause_queue("emails")
    assert isinstance(paused, Queue) and paused.paused and paused.counts is not None
    assert tickler.claim("emails", worker="w") == []  # a paused queue delivers nothing
    tickler.schedule("emails", "still-scheduled")  # scheduling goes on
    assert tickler.get_queue("emails").paused
    assert admin.pause_queue("emails").paused  # pausing twice is pausing
    assert not admin.resume_queue("emails").paused
    assert [lease.events[0].item_key for lease in tickler.claim("emails", worker="w")] == ["k"]
    with pytest.raises(Forbidden):
        tickler.pause_queue("emails")


def test_queue_settings_counts_and_flow_control(admin: Client, tickler: Client) -> None:
    tickler.schedule("emails", "due")
    tickler.schedule("emails", "later", delay=3600)
    queue = tickler.get_queue("emails")
    assert queue.counts is not None and (queue.counts["pending"], queue.counts["due"]) == (2, 1)
    assert (queue.delivery, queue.max_in_flight, queue.rate_per_second) == ({"mode": "pull"}, None, None)
    limited = admin.put_queue("emails", max_in_flight=2, rate_per_second=50.0, lease_seconds=12)
    assert (limited.max_in_flight, limited.rate_per_second, limited.lease_seconds) == (2, 50.0, 12.0)
    cleared = admin.put_queue("emails", max_in_flight=None)
    assert (cleared.max_in_flight, cleared.rate_per_second) == (None, 50.0)  # only what was given changes
    assert [q.name for q in tickler.list_queues()] == ["emails"]
    admin.put_queue("other", delivery="pull")
    assert [q.name for q in admin.list_queues()] == ["emails", "other"]
    with pytest.warns(DeprecationWarning, match='delivery="pull"'):
        assert admin.put_queue("third", pull=True).delivery == {"mode": "pull"}  # the old spelling still works
    with pytest.raises(ValidationError) as caught:
        admin.put_queue("emails", max_in_flight=0)
    assert "max_in_flight" in caught.value.errors


def test_delete_queue(admin: Client, tickler: Client) -> None:
    tickler.schedule("emails", "k", delay=60)
    with pytest.raises(Conflict):
        admin.delete_queue("emails")
    deleted = admin.delete_queue("emails", cancel_open=True)
    assert deleted == DeletedQueue(name="emails", cancelled=1, deleted_events=deleted.deleted_events)
    with pytest.raises(NotFound):
        admin.get_queue("emails")


def test_admins_issue_list_and_revoke_tokens(
    admin: Client, tickler: Client, live_server: str, make_client: MakeClient
) -> None:
    issued = admin.create_token("billing-service", queues=["emails"])
    assert (
        isinstance(issued, Token)
        and issued.token
        and (issued.name, issued.queues, issued.admin)
        == (
            "billing-service",
            ["emails"],
            False,
        )
    )
    billing = make_client(live_server, issued.token)
    assert billing.schedule("emails", "invoice:1").enqueued_by == "billing-service"
    listed = {t.id: t for t in admin.list_tokens()}
    assert listed[issued.id].token is None and listed[issued.id].revoked_on is None  # never shown again
    assert listed[issued.id].last_used_at is not None  # the schedule above used it
    revoked = admin.revoke_token(issued.id)
    assert revoked.revoked_on is not None and admin.revoke_token(issued.id).revoked_on == revoked.revoked_on
    with pytest.raises(Unauthorized):
        billing.get("emails", "invoice:1")
    with pytest.raises(Forbidden):
        tickler.list_tokens()  # a queue token is no admin
    with pytest.raises(NotFound):
        admin.revoke_token(999_999)
    with pytest.raises(ValidationError) as caught:
        admin.create_token("x", queues=["Not A Queue"])
    assert "queues" in caught.value.errors
