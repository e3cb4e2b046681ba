"""The dispatcher: wake up, claim due events, deliver them, finish or fail them.

One claim loop per process, never holding a transaction while delivering:

    wake-up (NOTIFY, next due time, safety poll) -> claim (batch, per queue) -> deliver (thread
    pool, bounded per queue) -> finish (acks batched into one statement) or fail (backoff)

APScheduler runs the periodic jobs (the safety poll and the lease reaper); the claim loop is a
plain thread, so a wake-up is never dropped for arriving while a job runs (see STACK.md).
"""

from __future__ import annotations

import queue as queue_module
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy.exc
import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from scheduler import metrics
from scheduler.delivery import Dead, Delivered, Deliverer, Failed, Outcome
from scheduler.errors import StaleLease
from scheduler.models import Lease, Queue
from scheduler.store import Store
from scheduler.wakeup import WakeupListener

log = structlog.get_logger(__name__)

DATABASE_ERRORS = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)


@dataclass(frozen=True)
class DispatcherConfig:
    worker_name: str
    # Leases asked for per claim (per queue).
    batch_size: int = 100
    # Delivery threads of this process (they mostly wait on I/O).
    concurrency: int = 96
    # Leases of one queue claimed and not yet delivered: a slow receiver cannot take every thread.
    queue_concurrency: int = 64
    # Safety net: look for due events at least this often, whatever the wake-ups say.
    poll_interval: float = 5.0
    # How often to end expired leases.
    reap_interval: float = 1.0
    # How often to re-read which queues to serve and their settings.
    refresh_interval: float = 5.0
    # On stop: how long deliveries in progress may take to finish.
    shutdown_grace: float = 10.0
    # After a claim that came back small, wait at least this long before the next one, so that
    # events falling due a fraction of a millisecond apart are claimed (and acked) together
    # instead of each costing its own commits: at most this much lateness, for throughput.
    coalesce_seconds: float = 0.005


@dataclass
class _Done:
    queue: str
    lease: Lease
    outcome: Outcome


@dataclass
class _Routes:
    """Which queues this dispatcher serves, with their settings, as last read."""

    queues: list[Queue] = field(default_factory=list)
    read_at: float = float("-inf")


class Dispatcher:
    def __init__(
        self,
        store: Store,
        listener: WakeupListener,
        config: DispatcherConfig,
        *,
        deliverers: Mapping[str, Deliverer] | None = None,
        webhook: Deliverer | None = None,
    ) -> None:
        """`deliverers` maps queue names to their in-process deliverer; `webhook`, when given,
        delivers every webhook queue."""
        self.store = store
        self.listener = listener
        self.config = config
        self.deliverers = dict(deliverers or {})
        self.webhook = webhook
        # Deliveries run on daemon threads fed by this queue, not a ThreadPoolExecutor: the
        # interpreter joins an executor's threads at exit, so one handler still hung after the
        # grace period would keep a stopped worker process alive forever.
        self._work: queue_module.Queue[tuple[Queue, Lease, float] | None] = queue_module.Queue()
        self._done: queue_module.Queue[_Done] = queue_module.Queue()
        self._lock = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self._not_started: set[str] = set()
        # lease id -> (when to extend it next, monotonic; its length in seconds)
        self._running_leases: dict[str, tuple[float, float]] = {}
        self._running = 0
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._routes = _Routes()
        self._scheduler = BackgroundScheduler(daemon=True)
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Dispatcher:
        self.listener.start()
        self._scheduler.add_job(
            self._safety_poll,
            "interval",
            seconds=self.config.poll_interval,
            id="safety_poll",
            max_instances=1,
            coalesce=True,
        )
        self._scheduler.add_job(
            self._reap, "interval", seconds=self.config.reap_interval, id="lease_reaper", max_instances=1, coalesce=True
        )
        self._scheduler.add_job(
            self._heartbeat,
            "interval",
            seconds=self.config.reap_interval,
            id="lease_heartbeat",
            max_instances=1,
            coalesce=True,
        )
        self._scheduler.start()
        for target, name in ((self._claim_loop, "tickler-claim"), (self._finish_loop, "tickler-finish")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        for n in range(self.config.concurrency):
            threading.Thread(target=self._delivery_loop, name=f"tickler-deliver-{n}", daemon=True).start()
        log.info(
            "dispatcher_started",
            worker=self.config.worker_name,
            queues=sorted(self.deliverers),
            webhooks=self.webhook is not None,
        )
        return self

    def stop(self) -> None:
        """Stop claiming; give back leases not yet started; let deliveries in progress finish
        (up to the grace period) and record their outcomes; then stop."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
            unstarted = list(self._not_started)
        self.listener.poke()
        if unstarted:
            try:
                released = self.store.leases.release(unstarted, actor=self.config.worker_name)
                log.info("leases_released", leases=len(unstarted), events=released)
            except DATABASE_ERRORS as error:
                log.warning("release_failed", error=str(error))  # they will expire and be redelivered
        deadline = time.monotonic() + self.config.shutdown_grace
        with self._lock:
            self._lock.wait_for(lambda: self._running == 0, timeout=self.config.shutdown_grace)
            stuck = list(self._running_leases)
        if stuck:
            # Deliveries still running when the grace period ends die with this process: give
            # their leases back so the events are claimable now, not when the leases expire.
            try:
                released = self.store.leases.release(stuck, actor=self.config.worker_name)
                log.warning("running_leases_released", leases=len(stuck), events=released)
            except DATABASE_ERRORS as error:
                log.warning("release_failed", error=str(error))
        self._done.put(_STOP)
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()) + 5)
        for _ in range(self.config.concurrency):
            self._work.put(None)  # idle delivery threads end; hung ones die with the process
        self._scheduler.shutdown(wait=False)
        self.listener.stop()
        self._stopped.set()
        log.info("dispatcher_stopped", worker=self.config.worker_name)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # -- periodic jobs ----------------------------------------------------------------------------

    def _safety_poll(self) -> None:
        self.listener.poke()

    def _heartbeat(self) -> None:
        """Extend the leases of deliveries still running at half their length, so that a handler
        or a receiver slower than the lease is not delivered a second time elsewhere meanwhile."""
        now = time.monotonic()
        with self._lock:
            due = [(lease_id, seconds) for lease_id, (at, seconds) in self._running_leases.items() if at <= now]
        for lease_id, seconds in due:
            try:
                self.store.leases.extend(lease_id, seconds=seconds)
                next_at = time.monotonic() + seconds / 2
            except StaleLease:
                log.warning("heartbeat_on_stale_lease", lease_id=lease_id)
                next_at = float("inf")  # lost: its outcome will be refused as stale
            except DATABASE_ERRORS as error:
                log.warning("heartbeat_database_error", error=str(error).splitlines()[0])
                return
            with self._lock:
                if lease_id in self._running_leases:
                    self._running_leases[lease_id] = (next_at, seconds)

    def _reap(self) -> None:
        try:
            expired = self.store.leases.expire(actor="tickler")
        except DATABASE_ERRORS as error:
            log.warning("reaper_database_error", error=str(error))
            return
        for queue, n in expired.items():
            metrics.LEASE_EXPIRED.labels(queue).inc(n)
            log.info("leases_expired", queue=queue, events=n)
            self.listener.poke(queue)

    # -- claiming ---------------------------------------------------------------------------------

    def _queues(self) -> list[Queue]:
        """The queues to serve: those with an in-process deliverer, and webhook queues."""
        if time.monotonic() - self._routes.read_at >= self.config.refresh_interval:
            queues = self.store.queues.list(sorted(self.deliverers)) if self.deliverers else []
            if self.webhook is not None:
                known = {q.name for q in queues}
                queues += [q for q in self.store.queues.list() if q.delivery_mode == "webhook" and q.name not in known]
            self._routes = _Routes(queues, time.monotonic())
        return self._routes.queues

    def _free(self, queue: str) -> int:
        with self._lock:
            return self._free_locked(queue)

    def _free_locked(self, queue: str) -> int:
        total = sum(self._in_flight.values())
        return max(
            0, min(self.config.queue_concurrency - self._in_flight.get(queue, 0), self.config.concurrency - total)
        )

    @property
    def _claim_threshold(self) -> int:
        """Claim for a queue with deliveries in progress only once this many slots are free:
        claims (and their acks) then carry whole batches instead of the one or two slots the
        last delivery freed — each transaction costs a WAL flush."""
        return max(1, min(self.config.batch_size, self.config.queue_concurrency) // 2)

    def _claim_loop(self) -> None:
        groups_first = False
        failures = 0
        last_small_claim = float("-inf")
        while not self._stopping.is_set():
            try:
                # The mark comes first: whatever is notified from here on wakes the wait below.
                # Serving webhooks, any queue may turn out to be one: wake for every queue.
                wait_on = None if self.webhook is not None else sorted(self.deliverers)
                mark = self.listener.mark(wait_on)
                if self.listener.take_recent() - {q.name for q in self._routes.queues}:
                    # Settings changed, a queue we do not know yet (maybe a new webhook queue), or
                    # notifications were missed: read the queues again now.
                    self._routes.read_at = float("-inf")
                queues = self._queues()
                claimed, open_names = 0, []
                for queue in queues:
                    with self._lock:
                        free = self._free_locked(queue.name)
                        busy = self._in_flight.get(queue.name, 0) > 0
                    if free <= 0 or (busy and free < self._claim_threshold):
                        continue  # a delivery finishing will wake this loop
                    open_names.append(queue.name)
                    leases = self.store.leases.claim(
                        queue,
                        worker=self.config.worker_name,
                        limit=min(self.config.batch_size, free),
                        groups_first=groups_first,
                    )
                    groups_first = not groups_first
                    if leases:
                        claimed += len(leases)
                        metrics.CLAIM_BATCH.labels(queue.name).observe(len(leases))
                        self._submit(queue, leases)
                failures = 0
                if claimed >= self.config.batch_size // 4:
                    continue  # a good batch: there may be more due right away
                if claimed:
                    last_small_claim = time.monotonic()
                    if self._stopping.wait(self.config.coalesce_seconds):
                        break
                    continue
                timeout = self.config.refresh_interval
                if open_names:
                    plan = self.store.leases.plan_sleep(open_names, max_seconds=self.config.poll_interval)
                    timeout = max(plan.seconds, self.config.coalesce_seconds - (time.monotonic() - last_small_claim))
                if not self.listener.connected.is_set():
                    timeout = min(timeout, 0.5)
                self.listener.wait(wait_on, mark, timeout)
            except DATABASE_ERRORS as error:
                failures += 1
                delay = min(5.0, 0.1 * 2**failures)
                log.warning("claim_loop_database_error", error=str(error).splitlines()[0], retry_in=delay)
                self._stopping.wait(delay)
            except Exception:
                log.exception("claim_loop_error")
                self._stopping.wait(1.0)

    def _submit(self, queue: Queue, leases: list[Lease]) -> None:
        claimed_at = time.monotonic()
        with self._lock:
            stopping = self._stopping.is_set()
            if not stopping:
                self._in_flight[queue.name] = self._in_flight.get(queue.name, 0) + len(leases)
                self._not_started.update(lease.lease_id for lease in leases)
        if stopping:
            # Claimed while stop() was giving back the leases not started: it did not see these,
            # and no delivery thread will start them; give them back too, or they wait for expiry.
            try:
                self.store.leases.release([lease.lease_id for lease in leases], actor=self.config.worker_name)
            except DATABASE_ERRORS as error:
                log.warning("release_failed", error=str(error))  # they will expire and be redelivered
            return
        for lease in leases:
            self._work.put((queue, lease, claimed_at))

    def _delivery_loop(self) -> None:
        while (item := self._work.get()) is not None:
            self._deliver(*item)

    # -- delivering -------------------------------------------------------------------------------

    def _deliverer(self, queue: Queue) -> Deliverer | None:
        found = self.deliverers.get(queue.name)
        if found is None and queue.delivery_mode == "webhook":
            found = self.webhook
        return found

    def _deliver(self, queue: Queue, lease: Lease, claimed_at: float) -> None:
        with self._lock:
            if self._stopping.is_set():
                return  # stop() gives this lease back
            self._not_started.discard(lease.lease_id)
            self._running_leases[lease.lease_id] = (claimed_at + queue.lease_seconds / 2, queue.lease_seconds)
            self._running += 1
        try:
            started = time.monotonic()
            for event in lease.events:
                if event.claimed_on is not None:
                    lateness = (event.claimed_on - event.schedule_on).total_seconds() + (started - claimed_at)
                    metrics.LATENESS.labels(queue.name).observe(max(0.0, lateness))
            deliverer = self._deliverer(queue)
            outcome: Outcome
            if deliverer is None:
                outcome = Failed("no deliverer for this queue in this worker")
            else:
                try:
                    outcome = deliverer.deliver(queue, lease)
                except Exception as error:  # a deliverer's own bug must not lose the lease
                    log.exception("deliverer_error", queue=queue.name)
                    outcome = Failed(f"{type(error).__name__}: {error}")
            self._done.put(_Done(queue.name, lease, outcome))
        finally:
            with self._lock:
                self._running -= 1
                self._running_leases.pop(lease.lease_id, None)
                # The slot is free once the delivery returned, not once its outcome is written:
                # the finisher's batched acks then never hold the next claim back.
                before = self._free_locked(queue.name)
                self._in_flight[queue.name] = self._in_flight.get(queue.name, 0) - 1
                crossed = before < self._claim_threshold <= self._free_locked(queue.name)
                self._lock.notify_all()
            if crossed or self._in_flight.get(queue.name, 0) == 0:
                self.listener.poke(queue.name)  # enough room for a claim again

    # -- finishing --------------------------------------------------------------------------------

    def _finish_loop(self) -> None:
        pending: list[_Done] = []
        stop_seen = False
        failures = 0
        while True:
            if not pending:
                item = self._done.get()
                if item is _STOP:
                    return
                pending.append(item)
            while len(pending) < 1000:
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
            except DATABASE_ERRORS as error:
                failures += 1
                log.warning("finish_database_error", error=str(error).splitlines()[0], pending=len(pending))
                if stop_seen and failures > 3:
                    log.error("finish_abandoned", leases=len(pending))  # the leases expire; redelivered
                    return
                time.sleep(min(5.0, 0.1 * 2**failures))  # back off from a database that is down
            except Exception:
                # Not the database being away (a bug, or a value it refuses): retrying would fail
                # the same way. Drop these outcomes (their leases expire and are redelivered) and
                # go on: a dead finisher would never free capacity again and stall this worker.
                log.exception("finish_error", leases=len(pending))
                pending = []
            if stop_seen and not pending:
                return

    def _finish(self, done: list[_Done]) -> None:
        acks = [d for d in done if isinstance(d.outcome, Delivered)]
        finished: set[str] = set()
        if acks:
            live = self.store.leases.ack([d.lease.lease_id for d in acks])
            for d in acks:
                if d.lease.lease_id in live:
                    metrics.DELIVERED.labels(d.queue).inc(len(d.lease.events))
                else:
                    log.warning("ack_of_stale_lease", queue=d.queue, lease_id=d.lease.lease_id)
                finished.add(d.lease.lease_id)
        for d in done:
            if isinstance(d.outcome, Delivered):
                continue
            assert isinstance(d.outcome, (Failed, Dead))
            try:
                result = self.store.leases.nack(
                    d.lease.lease_id,
                    error=d.outcome.error,
                    retry_in_seconds=d.outcome.retry_in_seconds if isinstance(d.outcome, Failed) else None,
                    dead=isinstance(d.outcome, Dead),
                )
                metrics.FAILED.labels(d.queue).inc()
                if result.dead:
                    metrics.DEAD.labels(d.queue).inc(result.dead)
                log.info(
                    "delivery_failed",
                    queue=d.queue,
                    lease_id=d.lease.lease_id,
                    error=d.outcome.error,
                    dead=result.dead,
                    retry_at=_iso(result.retry_at),
                )
            except StaleLease:
                log.warning("nack_of_stale_lease", queue=d.queue, lease_id=d.lease.lease_id)
            finished.add(d.lease.lease_id)


_STOP = _Done("", Lease("", "", None, datetime.min, "", ()), Delivered())


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
