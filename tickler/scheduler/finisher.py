"""The finisher: records the outcomes of deliveries — acks batched into one statement, each
failure through its own nack — on one thread, so delivery threads never wait on a commit."""

from __future__ import annotations

import queue as queue_module
import threading
import time
from dataclasses import dataclass
from datetime import datetime

import structlog

from tickler.scheduler import tracing
from tickler.scheduler.db import unavailable_reason
from tickler.scheduler.delivery import Dead, Delivered, Failed, Outcome
from tickler.scheduler.errors import StaleLease
from tickler.scheduler.models import Lease
from tickler.scheduler.store import Store
from tickler.scheduler.tracing import TraceContext

log = structlog.get_logger(__name__)

# Outcomes recorded per round at most (one ack statement carries all the round's deliveries).
MAX_ROUND = 1000


@dataclass
class Done:
    queue: str
    lease: Lease
    outcome: Outcome
    trace: TraceContext | None = None  # the attempt's span (tracing on)

    def settled(self, started: int, operation: str, outcome: str, *, error: str | None = None) -> None:
        """The `settle` span of its ack or nack, begun at `started`, under the attempt's span (tracing
        on). `error`: the ack found the lease stale."""
        if self.trace is not None:
            tracing.record(
                "settle",
                self.queue,
                started,
                parent=self.trace,
                error=error,
                error_type="stale_lease",
                messaging__operation__name=operation,
                tickler__lease_id=self.lease.lease_id,
                tickler__outcome=outcome,
            )


_STOP = Done("", Lease("", "", None, datetime.min, "", ()), Delivered())


class Finisher:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._done: queue_module.Queue[Done] = queue_module.Queue()
        self._thread = threading.Thread(target=self._loop, name="tickler-finish", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, queue: str, lease: Lease, outcome: Outcome, trace: TraceContext | None = None) -> None:
        self._done.put(Done(queue, lease, outcome, trace))

    def stop(self, timeout: float) -> None:
        """Record what is still waiting (retrying a database that is away a few times), then end."""
        self._done.put(_STOP)
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        pending: list[Done] = []
        stop_seen = False
        failures = 0
        while True:
            if not pending:
                item = self._done.get()
                if item is _STOP:
                    return
                pending.append(item)
            while len(pending) < MAX_ROUND:
                try:
                    item = self._done.get_nowait()
                except queue_module.Empty:
                    break
                if item is _STOP:
                    stop_seen = True
                    break
                pending.append(item)
            try:
                self._finish(pending)
                pending = []
                failures = 0
            except Exception as error:
                if unavailable_reason(error) is None:
                    # Not the database being away or refusing writes (a bug, or a value it
                    # refuses): retrying would fail the same way. Drop these outcomes (their
                    # leases expire and are redelivered) and go on: a dead finisher would never
                    # free capacity again and stall this worker.
                    log.exception("finish_error", leases=len(pending))
                    pending = []
                    if stop_seen:
                        return
                    continue
                failures += 1
                log.warning("finish_database_error", error=str(error).splitlines()[0], pending=len(pending))
                if stop_seen and failures > 3:
                    log.error("finish_abandoned", leases=len(pending))  # the leases expire; redelivered
                    return
                time.sleep(min(5.0, 0.1 * 2**failures))  # back off from a database that is down
            if stop_seen and not pending:
                return

    def _finish(self, done: list[Done]) -> None:
        acks = [d for d in done if isinstance(d.outcome, Delivered)]
        if acks:
            started = time.time_ns()
            trace_ids = {d.lease.lease_id: d.trace.trace_id for d in acks if d.trace is not None}
            live = self.store.leases.ack([d.lease.lease_id for d in acks], trace_ids=trace_ids)
            for d in acks:
                stale = d.lease.lease_id not in live
                if stale:
                    log.warning("ack_of_stale_lease", queue=d.queue, lease_id=d.lease.lease_id)
                d.settled(started, "ack", "delivered", error="the lease expired before its ack" if stale else None)
        for d in done:
            if isinstance(d.outcome, Delivered):
                continue
            assert isinstance(d.outcome, (Failed, Dead))
            started = time.time_ns()
            try:
                result = self.store.leases.nack(
                    d.lease.lease_id,
                    error=d.outcome.error,
                    retry_in_seconds=d.outcome.retry_in_seconds if isinstance(d.outcome, Failed) else None,
                    dead=isinstance(d.outcome, Dead),
                    trace_id=d.trace.trace_id if d.trace is not None else None,
                )
                d.settled(started, "nack", "dead" if result.dead else "failed")
                # A failed attempt is a warning; the one that makes the events dead is an error,
                # the line an operator is paged for. Both name the keys, which people search by.
                (log.error if result.dead else log.warning)(
                    "delivery_failed",
                    queue=d.queue,
                    item_key=d.lease.events[0].item_key if len(d.lease.events) == 1 else None,
                    item_keys=[event.item_key for event in d.lease.events] if len(d.lease.events) > 1 else None,
                    group_key=d.lease.group_key,
                    lease_id=d.lease.lease_id,
                    error=d.outcome.error,
                    dead=result.dead,
                    retry_at=result.retry_at.isoformat() if result.retry_at else None,
                )
            except StaleLease:
                log.warning("nack_of_stale_lease", queue=d.queue, lease_id=d.lease.lease_id)
