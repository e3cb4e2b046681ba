"""The dispatcher: wake up, claim due events, deliver them; the finisher records the outcomes.

One claim loop per process, never holding a transaction while delivering:

    wake-up (NOTIFY, next due time, safety poll) -> claim (batch, per queue; waiting.py)
    -> deliver (webhooks: tasks on one event loop thread, delivery/loop.py; in-process handlers:
    a thread pool; both bounded per queue and per process) -> finish (finisher.py: acks batched
    into one statement, failures with backoff)

APScheduler runs the periodic jobs (the safety poll, the lease keeper's heartbeat and reaper in
lease_keeper.py, recurring schedules); the claim loop is a plain thread, so a wake-up is never
dropped for arriving while a job runs (see STACK.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from tickler.config import WorkerSettings
from tickler.scheduler import erasing, history, metrics, recurring, statistics, tracing, upkeep
from tickler.scheduler.db import unavailable_reason
from tickler.scheduler.delivery import AsyncDeliverer, Dead, Delivered, Deliverer, Failed, LeaseEnded, Outcome
from tickler.scheduler.delivery.loop import LoopThread
from tickler.scheduler.finisher import Finisher
from tickler.scheduler.lease_keeper import LeaseKeeper
from tickler.scheduler.models import Lease, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.tracing import TraceContext
from tickler.scheduler.waiting import Round, WorkWaiter
from tickler.scheduler.wakeup import WakeupListener

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class DispatcherConfig(WorkerSettings):
    """A dispatcher's name and its tuning knobs (their meanings and defaults: config.WorkerSettings)."""

    worker_name: str
    # Days the operations log keeps its entries (TICKLER_AUDIT_RETENTION_DAYS).
    audit_retention_days: int = 365


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
        webhook: AsyncDeliverer | None = None,
        secret_key: str = "",
    ) -> None:
        """`deliverers` maps queue names to their in-process deliverer; `webhook`, when given,
        delivers every webhook queue; `secret_key`: TICKLER_SECRET_KEY, which keys the hashes of
        erased values (empty: the key kept in the database)."""
        self.store = store
        self.listener = listener
        self.config = config
        self.deliverers = dict(deliverers or {})
        self.webhook = webhook
        self.finisher = Finisher(store)
        self.keeper = LeaseKeeper(store, listener)
        self.eraser = erasing.Eraser(store.engine, erasing.Hasher(store.engine, secret_key))
        # Serving webhooks, any queue may turn out to be one: wake for every queue.
        self.waiter = WorkWaiter(store, listener, None if webhook is not None else self.deliverers)
        # Deliveries run on daemon threads fed by this queue, not a ThreadPoolExecutor: the
        # interpreter joins an executor's threads at exit, so one handler still hung after the
        # grace period would keep a stopped worker process alive forever.
        self._work: _WorkQueue[tuple[Queue, Lease, float] | None] = _WorkQueue()
        # The lateness histogram's child of each queue (labels() locks and looks up on every call).
        self._lateness: dict[str, Any] = {}
        self._lock = threading.Condition()
        self._in_flight: dict[str, int] = {}
        # Deliveries claimed and not yet returned, across queues: on threads, on the event loop.
        self._threaded = 0
        self._looped = 0
        self._loop = LoopThread() if webhook is not None else None
        self._not_started: set[str] = set()
        self._running = 0
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._routes = _Routes()
        self._scheduler = BackgroundScheduler(daemon=True)
        self._claimer = threading.Thread(target=self._claim_loop, name="tickler-claim", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Dispatcher:
        self.listener.start()
        self._every(self._safety_poll, self.config.poll_interval, "safety_poll")
        self._every(self.keeper.reap, self.config.reap_interval, "lease_reaper")
        self._every(self.keeper.heartbeat, self.config.reap_interval, "lease_heartbeat")
        self._every(recurring.periodic(self.store.engine), recurring.INTERVAL_SECONDS, "recurring_schedules")
        # The hot tables' planner statistics and the lease table's dead rows: at start (a new
        # database, a large import), then every second (scheduler/statistics.py; a run that finds
        # the previous one still at work returns at once, hence two instances).
        self._every(
            statistics.periodic(self.store),
            statistics.INTERVAL_SECONDS,
            "planner_statistics",
            at_start=True,
            instances=2,
        )
        # History partitions: once at start (a worker that was down for days), then now and then.
        self._every(history.periodic(self.store), history.INTERVAL_SECONDS, "history_maintenance", at_start=True)
        # Erasures requested over the API or the command line; one left unfinished by a process
        # that died is taken up again at start.
        self._every(erasing.periodic(self.eraser), erasing.INTERVAL_SECONDS, "erasures", at_start=True)
        # The operations log's retention and the upcoming-load counters' folding, as rarely.
        self._every(
            upkeep.periodic(self.store, self.config.audit_retention_days),
            upkeep.INTERVAL_SECONDS,
            "operations_upkeep",
            at_start=True,
        )
        self._scheduler.start()
        self.finisher.start()
        if self._loop is not None:
            self._loop.start()
        self._claimer.start()
        for n in range(self.config.concurrency):
            threading.Thread(target=self._delivery_loop, name=f"tickler-deliver-{n}", daemon=True).start()
        log.info(
            "dispatcher_started",
            worker=self.config.worker_name,
            queues=sorted(self.deliverers),
            webhooks=self.webhook is not None,
            # the tuning it runs with (TICKLER_WORKER_*, options, defaults)
            **{knob.name: getattr(self.config, knob.name) for knob in fields(WorkerSettings)},
        )
        return self

    def _every(
        self, job: Callable[[], None], seconds: float, name: str, *, at_start: bool = False, instances: int = 1
    ) -> None:
        """Run `job` every `seconds` on the scheduler's thread pool (`at_start`: and once now); a
        run that comes due while `instances` runs are still at work is skipped, late runs are
        coalesced into one."""
        first: dict[str, Any] = {"next_run_time": datetime.now(UTC)} if at_start else {}
        self._scheduler.add_job(
            job, "interval", seconds=seconds, id=name, max_instances=instances, coalesce=True, **first
        )

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
            self._release(unstarted, "leases_released")
        deadline = time.monotonic() + self.config.shutdown_grace
        with self._lock:
            self._lock.wait_for(lambda: self._running == 0, timeout=self.config.shutdown_grace)
        stuck = self.keeper.running()
        if stuck:
            # Deliveries still running when the grace period ends die with this process: give
            # their leases back so the events are claimable now, not when the leases expire.
            self._release(stuck, "running_leases_released")
        if self._loop is not None:
            # Requests still waiting end here (their leases were just given back) and record no
            # outcome; the client's connections close.
            self._loop.stop(self.webhook.aclose if self.webhook is not None else None)
        self._claimer.join(timeout=max(0.1, deadline - time.monotonic()) + 5)
        self.finisher.stop(timeout=max(0.1, deadline - time.monotonic()) + 5)
        # idle delivery threads end; hung ones die with the process
        self._work.put_many([None] * self.config.concurrency)
        # Periodic jobs still running (a reap, a heartbeat) finish before stop() returns: the
        # caller may close the engine next, and a job's pooled connection given back to a
        # disposed pool would stay open until garbage-collected. Bounded: a job stuck on an
        # unreachable database must not hold up the shutdown.
        closer = threading.Thread(target=self._scheduler.shutdown, kwargs={"wait": True}, daemon=True)
        closer.start()
        closer.join(timeout=10)
        self.listener.stop()
        self._stopped.set()
        log.info("dispatcher_stopped", worker=self.config.worker_name)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def _release(self, lease_ids: list[str], what: str) -> None:
        try:
            released = self.store.leases.release(lease_ids, actor=self.config.worker_name)
            log.info(what, leases=len(lease_ids), events=released)
        except Exception as error:
            if unavailable_reason(error) is None:
                raise
            log.warning("release_failed", error=str(error))  # they will expire and be redelivered

    def _safety_poll(self) -> None:
        self.listener.poke()

    # -- claiming ---------------------------------------------------------------------------------

    def _queues(self) -> list[Queue]:
        """The queues to serve: those with an in-process deliverer, and webhook queues."""
        if time.monotonic() - self._routes.read_at >= self.config.refresh_interval:
            queues = self.store.queues.list(sorted(self.deliverers)) if self.deliverers else []
            if self.webhook is not None:
                known = {q.name for q in queues}
                queues += [q for q in self.store.queues.webhook_queues() if q.name not in known]
            self._routes = _Routes(queues, time.monotonic())
        return self._routes.queues

    def _looped_queue(self, queue: Queue) -> bool:
        """Whether this queue's deliveries run on the event loop (webhooks), not on threads."""
        return self.webhook is not None and queue.name not in self.deliverers and queue.delivery_mode == "webhook"

    def _caps(self, queue: Queue) -> tuple[int, int, int]:
        """(this queue's cap, the process's cap, the process's count) for the queue's kind of delivery."""
        if self._looped_queue(queue):
            return self.config.webhook_queue_concurrency, self.config.webhook_concurrency, self._looped
        return self.config.queue_concurrency, self.config.concurrency, self._threaded

    def _free_locked(self, queue: Queue) -> int:
        per_queue, per_process, running = self._caps(queue)
        return max(0, min(per_queue - self._in_flight.get(queue.name, 0), per_process - running))

    def _claim_threshold(self, queue: Queue) -> int:
        """Claim for a queue with deliveries in progress only once this many slots are free:
        claims (and their acks) then carry whole batches instead of the one or two slots the
        last delivery freed — each transaction costs a WAL flush."""
        return max(1, min(self.config.batch_size, self._caps(queue)[0]) // 2)

    def _claim_loop(self) -> None:
        """The wait-for-work loop (waiting.py) over every queue this dispatcher serves."""
        groups_first = False
        failures = 0
        last_small_claim = float("-inf")
        while not self._stopping.is_set():
            try:
                # The mark comes first: whatever is notified from here on wakes the wait below.
                mark = self.waiter.mark()
                if self.listener.take_recent() - {q.name for q in self._routes.queues}:
                    # Settings changed, a queue we do not know yet (maybe a new webhook queue), or
                    # notifications were missed: read the queues again now.
                    self._routes.read_at = float("-inf")
                done = Round()
                for queue in self._queues():
                    if queue.paused:
                        continue  # resuming it notifies its settings change, which wakes this loop
                    with self._lock:
                        free = self._free_locked(queue)
                        busy = self._in_flight.get(queue.name, 0) > 0
                    if free <= 0 or (busy and free < self._claim_threshold(queue)):
                        continue  # a delivery finishing will wake this loop
                    claim_started = time.time_ns()
                    claim_began = time.monotonic()  # the leases' deadline counts from here (lease_keeper.py)
                    claim = self.store.leases.claim_within_limits(
                        queue,
                        worker=self.config.worker_name,
                        limit=min(self.config.batch_size, free),
                        groups_first=groups_first,
                    )
                    groups_first = not groups_first
                    done.add(queue.name, claim)
                    if claim.leases:
                        _trace_claim(queue.name, claim.leases, claim_started)
                        # A limited queue's claim read its settings in its own snapshot: fresher.
                        self._submit(claim.queue or queue, claim.leases, claim_began)
                failures = 0
                if done.claimed >= self.config.batch_size // 4 and not done.held:
                    continue  # a good batch: there may be more due right away
                if done.claimed and not done.held:
                    last_small_claim = time.monotonic()
                    if self._stopping.wait(self.config.coalesce_seconds):
                        break
                    continue
                coalesce = self.config.coalesce_seconds - (time.monotonic() - last_small_claim)
                max_seconds = self.config.poll_interval if done.looked_at else self.config.refresh_interval
                self.waiter.sleep(mark, done, max_seconds=max_seconds, at_least=coalesce)
            except Exception as error:
                if unavailable_reason(error) is None:
                    log.exception("claim_loop_error")
                    self._stopping.wait(1.0)
                    continue
                # Away, restarting, or refusing writes (a standby after failover, a full disk).
                failures += 1
                delay = min(5.0, 0.1 * 2**failures)
                log.warning("claim_loop_database_error", error=str(error).splitlines()[0], retry_in=delay)
                self._stopping.wait(delay)

    def _submit(self, queue: Queue, leases: list[Lease], claimed_at: float) -> None:
        looped = self._looped_queue(queue)
        with self._lock:
            stopping = self._stopping.is_set()
            if not stopping:
                self._in_flight[queue.name] = self._in_flight.get(queue.name, 0) + len(leases)
                if looped:
                    self._looped += len(leases)
                else:
                    self._threaded += len(leases)
                self._not_started.update(lease.lease_id for lease in leases)
        if stopping:
            # Claimed while stop() was giving back the leases not started: it did not see these,
            # and no delivery thread will start them; give them back too, or they wait for expiry.
            self._release([lease.lease_id for lease in leases], "leases_released")
            return
        if looped:
            assert self._loop is not None
            self._loop.submit([self._deliver_on_loop(queue, lease, claimed_at) for lease in leases])
        else:
            self._work.put_many([(queue, lease, claimed_at) for lease in leases])

    # -- delivering -------------------------------------------------------------------------------

    def _delivery_loop(self) -> None:
        while (item := self._work.get()) is not None:
            self._deliver(*item)

    def _deliver(self, queue: Queue, lease: Lease, claimed_at: float) -> None:
        """An in-process handler's delivery, on a delivery thread."""
        if not self._starting(queue, lease, claimed_at):
            return
        outcome: Outcome | None = None
        try:
            # The attempt's span: current while the handler runs (its spans are children); a
            # single event's continues its producer's trace.
            with _attempt_span(queue.name, lease) as attempt:
                deliverer = self.deliverers.get(queue.name)
                if self.keeper.deadline(lease.lease_id) <= time.monotonic():
                    # It waited for a delivery thread past its lease: maybe taken away (an erasure)
                    # or claimed again elsewhere. Not started; the reaper ends it.
                    log.warning("lease_ended_before_delivery", queue=queue.name, lease_id=lease.lease_id)
                    return
                if deliverer is None:
                    outcome = Failed("no deliverer for this queue in this worker")
                else:
                    try:
                        outcome = deliverer.deliver(queue, lease)
                    except Exception as error:  # a deliverer's own bug must not lose the lease
                        outcome = _deliverer_bug(queue, error)
                _mark(attempt, outcome)
        finally:
            self._finished(queue, lease, outcome, attempt.context if outcome is not None else None, looped=False)

    async def _deliver_on_loop(self, queue: Queue, lease: Lease, claimed_at: float) -> None:
        """A webhook's delivery, a task on the event loop: the same steps, awaiting the request."""
        if not self._starting(queue, lease, claimed_at):
            return
        outcome: Outcome | None = None
        try:
            with _attempt_span(queue.name, lease) as attempt:  # current in this task: the request carries it
                assert self.webhook is not None
                try:
                    outcome = await self.webhook.deliver(queue, lease, lambda: self.keeper.deadline(lease.lease_id))
                except LeaseEnded:
                    # It waited (for the loop, a connection) past its lease: maybe taken away (an
                    # erasure) or claimed again elsewhere. Nothing was sent; the reaper ends it.
                    log.warning("lease_ended_before_request", queue=queue.name, lease_id=lease.lease_id)
                    return
                except Exception as error:  # a deliverer's own bug must not lose the lease
                    outcome = _deliverer_bug(queue, error)
                _mark(attempt, outcome)
        finally:
            # Cancelled (stop() after the grace period): no outcome; stop() gave the lease back.
            self._finished(queue, lease, outcome, attempt.context if outcome is not None else None, looped=True)

    def _starting(self, queue: Queue, lease: Lease, claimed_at: float) -> bool:
        """A delivery begins: count it running, keep its lease alive, observe its lateness.
        False when the dispatcher is stopping (stop() gives the lease back)."""
        with self._lock:
            if self._stopping.is_set():
                return False
            self._not_started.discard(lease.lease_id)
            self._running += 1
        self.keeper.track(lease.lease_id, claimed_at=claimed_at, seconds=queue.lease_seconds)
        started = time.monotonic()
        lateness_of = self._lateness.get(queue.name)
        if lateness_of is None:
            lateness_of = self._lateness.setdefault(queue.name, metrics.LATENESS.labels(queue.name))
        for event in lease.events:
            if event.claimed_on is not None:
                lateness = (event.claimed_on - event.schedule_on).total_seconds() + (started - claimed_at)
                lateness_of.observe(max(0.0, lateness))
        return True

    def _finished(
        self, queue: Queue, lease: Lease, outcome: Outcome | None, trace: TraceContext | None, *, looped: bool
    ) -> None:
        """A delivery returned (`outcome`) or was cut short (None): hand the outcome to the
        finisher and free its slot."""
        if outcome is not None:
            self.finisher.put(queue.name, lease, outcome, trace)
        self.keeper.untrack(lease.lease_id)
        with self._lock:
            self._running -= 1
            # The slot is free once the delivery returned, not once its outcome is written:
            # the finisher's batched acks then never hold the next claim back.
            before = self._free_locked(queue)
            self._in_flight[queue.name] = self._in_flight.get(queue.name, 0) - 1
            if looped:
                self._looped -= 1
            else:
                self._threaded -= 1
            threshold = self._claim_threshold(queue)
            crossed = before < threshold <= self._free_locked(queue)
            self._lock.notify_all()
        if crossed or self._in_flight.get(queue.name, 0) == 0:
            self.listener.poke(queue.name)  # enough room for a claim again


def _deliverer_bug(queue: Queue, error: Exception) -> Failed:
    """The outcome of an attempt whose deliverer raised: a failure naming the exception (logged
    with its traceback), which finishes the lease like any other."""
    log.exception("deliverer_error", queue=queue.name)
    return Failed(f"{type(error).__name__}: {error}")


def _mark(attempt: tracing.Span, outcome: Outcome) -> None:
    """The attempt's span says how it ended."""
    if isinstance(outcome, Delivered):
        attempt.set(tickler__outcome="delivered")
    elif isinstance(outcome, (Failed, Dead)):  # not a deliverer's bug (no outcome at all)
        kind = "dead" if isinstance(outcome, Dead) else "failed"
        attempt.set(tickler__outcome=kind)
        attempt.fail(outcome.error, kind)


class _WorkQueue(Generic[T]):
    """The delivery threads' queue: first in, first out, waking idle threads one at a time.

    queue.Queue wakes a thread for every item put, so a claimed batch of 100 leases woke 100
    threads, each a context switch and a turn at the GIL, even when one thread could deliver them
    all in less time than it takes to wake another (a fast in-process handler). Here at most one
    wake-up is on its way at once: a woken thread that takes an item and sees more waiting wakes
    the next. Slow deliveries still spread over every idle thread (one wake-up each, in a chain);
    fast ones are taken by the threads already running.
    """

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0  # threads waiting in get()
        self._waking = 0  # wake-ups sent and not yet taken up (0 or 1)

    def put_many(self, items: Iterable[T]) -> None:
        with self._cond:
            self._items.extend(items)
            self._wake_one_locked()

    def get(self) -> T:
        with self._cond:
            while not self._items:
                self._idle += 1
                self._cond.wait()  # no timeout: it returns only when notified
                self._idle -= 1
                self._waking -= 1
            item = self._items.popleft()
            self._wake_one_locked()
            return item

    def _wake_one_locked(self) -> None:
        # Items wait and a thread is idle: wake one, unless one is already on its way (it will
        # wake the next when it takes its item and sees more).
        if self._items and self._idle and not self._waking:
            self._waking += 1
            self._cond.notify()


def _attempt_span(queue: str, lease: Lease) -> AbstractContextManager[tracing.Span]:
    """The `process` span of a lease's attempt (nothing built when tracing is off)."""
    if not tracing.enabled():
        return tracing.noop()
    producers = [TraceContext.of_row(e) for e in lease.events]
    return tracing.span(
        "process",
        queue,
        parent=producers[0] if len(producers) == 1 else None,
        root=True,
        links=producers,
        active=True,
        **_attempt_attributes(lease),
    )


def _attempt_attributes(lease: Lease) -> dict[str, Any]:
    """What a span says about a lease's attempt (messaging conventions; tickler.* for the rest)."""
    first = lease.events[0]
    found: dict[str, Any] = {
        "messaging__batch__message_count": len(lease.events) if len(lease.events) > 1 else None,
        "messaging__consumer__group__name": lease.claimed_by,
        "tickler__lease_id": lease.lease_id,
        "tickler__group_key": lease.group_key,
    }
    if len(lease.events) == 1:
        found.update(
            messaging__message__id=str(first.id),
            tickler__item_key=first.item_key,
            tickler__attempt=first.redeliver_count + 1,
        )
    return found


def _trace_claim(queue: str, leases: list[Lease], started_ns: int) -> None:
    """The claim's `receive` span (tracing on), linked to the producers of what it claimed."""
    if not tracing.enabled():
        return
    producers = [TraceContext.of_row(e) for lease in leases for e in lease.events]
    tracing.record(
        "receive", queue, started_ns, root=True, links=producers, messaging__batch__message_count=len(producers)
    )
