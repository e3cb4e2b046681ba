"""The lease keeper: extends the leases of deliveries still running (heartbeat) and ends leases
whose time is up (reaper). Both run as periodic jobs of the dispatcher's scheduler."""

from __future__ import annotations

import threading
import time

import structlog

from tickler.scheduler.db import unavailable_reason
from tickler.scheduler.store import Store
from tickler.scheduler.wakeup import WakeupListener

log = structlog.get_logger(__name__)


class LeaseKeeper:
    def __init__(self, store: Store, listener: WakeupListener) -> None:
        self.store = store
        self.listener = listener
        self._lock = threading.Lock()
        # lease id -> (when to extend it next, monotonic; its length in seconds)
        self._running: dict[str, tuple[float, float]] = {}
        # lease id -> when it ends at the latest, monotonic: from a time read before the statement
        # that took or extended it (the database's expiry is no earlier); -inf once found lost.
        self._deadlines: dict[str, float] = {}

    def track(self, lease_id: str, *, claimed_at: float, seconds: float) -> None:
        """A delivery under this lease started (its lease was claimed at `claimed_at`, monotonic,
        read before the claim began)."""
        with self._lock:
            self._running[lease_id] = (claimed_at + seconds / 2, seconds)
            self._deadlines[lease_id] = claimed_at + seconds

    def deadline(self, lease_id: str) -> float:
        """When this lease ends at the latest (monotonic): after that, nothing is sent under it
        (an erasure may have taken it away, and waits only that long). -inf: not tracked or lost."""
        with self._lock:
            return self._deadlines.get(lease_id, float("-inf"))

    def untrack(self, lease_id: str) -> None:
        with self._lock:
            self._running.pop(lease_id, None)
            self._deadlines.pop(lease_id, None)

    def running(self) -> list[str]:
        """Leases of deliveries still running."""
        with self._lock:
            return list(self._running)

    def heartbeat(self) -> None:
        """Extend the leases of deliveries still running at half their length, so that a handler
        or a receiver slower than the lease is not delivered a second time elsewhere meanwhile.
        One statement per lease length: a worker may wait on a thousand slow requests at once."""
        now = time.monotonic()
        due: dict[float, list[str]] = {}
        with self._lock:
            for lease_id, (at, seconds) in self._running.items():
                if at <= now:
                    due.setdefault(seconds, []).append(lease_id)
        for seconds, lease_ids in due.items():
            asked = time.monotonic()
            try:
                live = self.store.leases.extend_many(lease_ids, seconds=seconds)
            except Exception as error:
                if unavailable_reason(error) is None:
                    raise
                log.warning("heartbeat_database_error", error=str(error).splitlines()[0])
                return
            next_at = time.monotonic() + seconds / 2
            with self._lock:
                for lease_id in lease_ids:
                    if lease_id not in self._running:
                        continue  # finished meanwhile
                    if lease_id in live:
                        self._running[lease_id] = (next_at, seconds)
                        self._deadlines[lease_id] = asked + seconds
                    else:
                        log.warning("heartbeat_on_stale_lease", lease_id=lease_id)
                        self._running[lease_id] = (float("inf"), seconds)  # lost: its outcome will be refused as stale
                        self._deadlines[lease_id] = float("-inf")  # and nothing more is sent under it

    def reap(self) -> None:
        """End expired leases (every queue): their events are claimable again, or dead."""
        try:
            expired = self.store.leases.expire(actor="tickler")
        except Exception as error:
            if unavailable_reason(error) is None:
                raise
            log.warning("reaper_database_error", error=str(error))
            return
        for queue, n in expired.items():
            log.info("leases_expired", queue=queue, events=n)
            self.listener.poke(queue)
