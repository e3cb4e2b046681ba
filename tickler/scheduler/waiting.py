"""Waiting for work: the loop every claimer runs — mark, claim, plan the sleep, wait.

The mark is taken before the claim, so a notification arriving while the claim runs is not lost
(see wakeup.py). After a round that found nothing to do, the claimer sleeps until the next due
time of the queues it looked at (plan_sleep publishes it, so writers of earlier events notify;
see tickler_queue.next_wake), until a queue its flow control held back may have room again, or
until notified. The dispatcher runs it over every queue it serves; a pull consumer's claim runs
it over one queue until its deadline (PullClaims).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tickler.scheduler.connect import DEFAULT_CONNECT_TIMEOUT
from tickler.scheduler.models import Lease, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.store.leases import Claim
from tickler.scheduler.wakeup import WakeupListener

# While the LISTEN connection is down, notifications are missed: look at least this often.
DISCONNECTED_POLL_SECONDS = 0.5


@dataclass
class Round:
    """What one pass of claims over some queues found, for the sleep that follows it."""

    claimed: int = 0
    # Queues claimed from that only a new or newly due event can give more (their due times count).
    looked_at: list[str] = field(default_factory=list)
    # Seconds until queues held back by their flow control may have room again.
    held: list[float] = field(default_factory=list)

    def add(self, queue: str, claim: Claim) -> None:
        self.claimed += len(claim.leases)
        if claim.room_in is not None:
            self.held.append(claim.room_in)  # due events may wait there: their due time says nothing
        elif not claim.paused:  # a paused queue waits for its resume, which notifies
            self.looked_at.append(queue)


class WorkWaiter:
    """Marks and sleeps for a claimer of `queues` (None: of every queue)."""

    def __init__(self, store: Store, listener: WakeupListener, queues: Iterable[str] | None) -> None:
        self.store = store
        self.listener = listener
        self.queues = None if queues is None else sorted(set(queues))

    def mark(self) -> tuple[int, ...]:
        return self.listener.mark(self.queues)

    def sleep(self, mark: tuple[int, ...], done: Round, *, max_seconds: float, at_least: float = 0.0) -> bool:
        """Sleep after `done` found nothing more to claim, at most `max_seconds` (and, when it looked
        at a queue, at least `at_least`); True if a notification after `mark` ended it."""
        timeout = max_seconds
        if done.looked_at:
            plan = self.store.leases.plan_sleep(done.looked_at, max_seconds=max_seconds)
            timeout = max(plan.seconds, at_least)
        if done.held:
            timeout = min(timeout, *done.held)
        if not self.listener.connected.is_set():
            timeout = min(timeout, DISCONNECTED_POLL_SECONDS)
        return self.listener.wait(self.queues, mark, timeout)


class PullClaims:
    """Pull consumers' claims, long-polling on the process's LISTEN connection: `listener` when
    given (its owner stops it), else one of its own, started on first use."""

    def __init__(
        self,
        store: Store,
        database_url: str,
        *,
        listener: WakeupListener | None = None,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.store = store
        self.database_url = database_url
        self.connect_timeout = connect_timeout
        self._listener = listener
        self._owned: WakeupListener | None = None
        self._lock = threading.Lock()

    def _listening(self) -> WakeupListener:
        with self._lock:
            if self._listener is None:
                self._listener = self._owned = WakeupListener(
                    self.database_url, connect_timeout=self.connect_timeout
                ).start()
            return self._listener

    def stop(self) -> None:
        """Stop the LISTEN connection this started (a listener given to it is its owner's)."""
        with self._lock:
            if self._owned is not None:
                self._owned.stop()
                self._listener = self._owned = None

    def claim(
        self, queue: Queue, *, worker: str, limit: int, lease_seconds: float | None, wait_seconds: float
    ) -> list[Lease]:
        """Claim up to `limit` leases of `queue`, waiting up to `wait_seconds` for one."""
        deadline = time.monotonic() + wait_seconds
        # Pull consumers may run with no dispatcher (and so no reaper) at all: the claim itself
        # takes events whose lease expired (claim_events, lock_due_groups).
        waiter = WorkWaiter(self.store, self._listening(), [queue.name]) if wait_seconds > 0 else None
        while True:
            mark = waiter.mark() if waiter else ()
            claim = self.store.leases.claim_within_limits(
                queue, worker=worker, limit=limit, lease_seconds=lease_seconds
            )
            remaining = deadline - time.monotonic()
            if claim.leases or waiter is None or remaining <= 0:
                return claim.leases
            if not queue.flow_limited:
                # The settings may be cached and stale (a queue just paused, limited or made fair
                # refuses the fast path it was on, which then finds nothing due and would look
                # again at once): read them.
                fresh = self.store.queues.get(queue.name)
                if fresh.claim_path != queue.claim_path:
                    queue = fresh
                    continue
            done = Round()
            done.add(queue.name, claim)
            waiter.sleep(mark, done, max_seconds=remaining)
