"""`Client.consume` against the real server: a handler that fails once is nacked then delivered,
a slow handler keeps its lease (heartbeat), `Nack` chooses the outcome, and the loop stops on an
event or a signal."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from tickler_client import Client, ConsumeStats, Lease, Nack

from tests.helpers_wait import wait_until


def consume_in_thread(
    client: Client, handler: Callable[[Lease], object], stop: threading.Event, **options: Any
) -> Callable[[], ConsumeStats]:
    """Start `client.consume` on a thread; the returned function waits for it to end."""
    result: list[ConsumeStats] = []
    thread = threading.Thread(
        target=lambda: result.append(
            client.consume("emails", handler, worker="consumer", wait_seconds=1, stop=stop, **options)
        )
    )
    thread.start()

    def join() -> ConsumeStats:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive(), "consume did not stop"
        return result[0]

    return join


def test_a_handler_that_fails_once_is_nacked_then_acked(tickler: Client) -> None:
    tickler.schedule("emails", "welcome:ana", {"to": "ana@example.com"})
    calls: list[int] = []
    stop = threading.Event()

    def handler(lease: Lease) -> None:
        calls.append(lease.events[0].redeliver_count)
        if len(calls) == 1:
            raise RuntimeError("smtp down")
        stop.set()

    join = consume_in_thread(tickler, handler, stop)
    wait_until(stop.is_set, what=lambda: f"handler calls: {calls}")
    stats = join()
    assert calls == [0, 1]
    assert (stats.claimed, stats.nacked, stats.acked, stats.lost) == (2, 1, 1, 0)
    event = tickler.get("emails", "welcome:ana")
    assert (event.status, event.redeliver_count, event.dequeued_by) == ("delivered", 1, "signup-service/consumer")
    timeline = tickler.timeline("emails", "welcome:ana")
    assert timeline.actions == ["enqueued", "claimed", "failed", "claimed", "delivered"]
    assert "RuntimeError: smtp down" in str(timeline.entries[2].details)


def test_a_slow_handler_keeps_its_lease(tickler: Client, raw: psycopg.Connection[Any]) -> None:
    tickler.schedule("emails", "slow")
    stop = threading.Event()
    first_expiry: list[datetime] = []

    def lease_outlived(expiry: datetime) -> bool:
        # The server's clock is past the lease's first expiry, and the lease was moved beyond it.
        row = raw.execute(
            "SELECT now() > %s, lease_expires_on > now() FROM tickler_event_all WHERE item_key = 'slow'", [expiry]
        ).fetchone()
        return row is not None and bool(row[0]) and bool(row[1])

    def handler(lease: Lease) -> None:
        first_expiry.append(lease.expires_at)
        wait_until(lambda: lease_outlived(lease.expires_at), what="the lease outliving its first expiry")
        stop.set()

    # 3 s: the heartbeat extends at half that, with room to spare on a busy machine
    join = consume_in_thread(tickler, handler, stop, lease_seconds=3)
    wait_until(stop.is_set)
    stats = join()
    assert (stats.acked, stats.nacked, stats.lost) == (1, 0, 0) and stats.extended >= 1
    event = tickler.get("emails", "slow")
    assert (event.status, event.redeliver_count) == ("delivered", 0)
    assert tickler.timeline("emails", "slow").actions == ["enqueued", "claimed", "delivered"]


def test_nack_chooses_dead_or_a_later_retry(tickler: Client) -> None:
    tickler.schedule("emails", "gone", group_key=None)
    tickler.schedule("emails", "full")
    stop = threading.Event()
    seen: list[str] = []

    def handler(lease: Lease) -> None:
        key = lease.events[0].item_key
        seen.append(key)
        if len(seen) == 2:
            stop.set()
        if key == "gone":
            raise Nack("address gone", dead=True)
        raise Nack("mailbox full", retry_in_seconds=3600)

    join = consume_in_thread(tickler, handler, stop)
    wait_until(stop.is_set)
    stats = join()
    assert (stats.nacked, stats.acked) == (2, 0)
    gone, full = tickler.get("emails", "gone"), tickler.get("emails", "full")
    assert (gone.status, gone.last_error) == ("dead", "address gone")
    assert (full.status, full.last_error) == ("pending", "mailbox full")
    assert full.schedule_on - datetime.now(UTC) > timedelta(minutes=50)


def test_stop_while_long_polling_returns_promptly(tickler: Client) -> None:
    stop = threading.Event()
    join = consume_in_thread(tickler, lambda lease: None, stop)
    stats = join()  # sets the event while the consumer waits for work
    assert stats == ConsumeStats()


def test_sigterm_stops_the_loop_after_the_lease_in_hand(tickler: Client) -> None:
    tickler.schedule("emails", "first")
    tickler.schedule("emails", "second", delay=3600)
    before = signal.getsignal(signal.SIGTERM)
    handled: list[str] = []

    def handler(lease: Lease) -> None:
        handled.append(lease.events[0].item_key)
        os.kill(os.getpid(), signal.SIGTERM)  # as a process manager would

    # In the main thread, so consume installs its signal handlers (and restores them after).
    stats = tickler.consume("emails", handler, worker="consumer", wait_seconds=1)
    assert handled == ["first"] and stats.acked == 1
    assert tickler.get("emails", "first").status == "delivered"
    assert tickler.get("emails", "second").status == "pending"
    assert signal.getsignal(signal.SIGTERM) == before
