"""Delivery by real worker processes and by the embeddable Worker, over a real PostgreSQL:
exactly once under concurrency, group handlers, retries and dead ends, and on-time wake-ups."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tests.workers.spawn import handled, logs, start_worker, stop_workers
from tickler.config import Settings
from tickler.scheduler.delivery import Delivered, Outcome
from tickler.scheduler.delivery.handlers import StopDelivery
from tickler.scheduler.dispatcher import Dispatcher, DispatcherConfig
from tickler.scheduler.models import Event, Lease, NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.wakeup import WakeupListener
from tickler.scheduler.worker import Worker

TEST_SETTINGS = Settings()


def count(raw: psycopg.Connection[Any], sql: str, *params: object) -> int:
    row = raw.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def delivered(raw: psycopg.Connection[Any], queue: str) -> int:
    return count(raw, "SELECT count(*) FROM tickler_event_all WHERE queue = %s AND outcome = 'delivered'", queue)


def actions(store: Store, queue: str, item_key: str) -> list[str]:
    return [entry.action for entry in store.events.timeline(queue, item_key)]


# The timeline of an event whose first two attempts failed.
TWO_FAILED_ATTEMPTS = ["enqueued", "claimed", "failed", "claimed", "failed"]


# -- 4 processes, 10,000 events ----------------------------------------------------------------------

EVENTS = 10_000


@pytest.mark.slow
def test_four_worker_processes_deliver_each_event_exactly_once(
    database_url: str, store: Store, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    queue = store.queues.put("work", QueueSettings(), TEST_SETTINGS).queue
    results = store.events.schedule_batch(queue, [NewEvent(f"job-{n}", {"n": n}) for n in range(EVENTS)], actor="test")
    ids = {r.id for r in results}
    assert len(ids) == EVENTS and None not in ids

    workers = [start_worker(database_url, tmp_path, name=f"w{n}") for n in range(4)]
    try:
        wait_until(
            lambda: delivered(raw, "work") == EVENTS,
            timeout=60,
            what=lambda: f"{delivered(raw, 'work')} of {EVENTS} delivered\n{logs(tmp_path)}",
        )
    finally:
        stop_workers(workers)

    times = handled(tmp_path)
    assert set(times) == ids
    assert [i for i, n in times.items() if n > 1] == []
    assert sum(times.values()) == EVENTS
    by_outcome = raw.execute(
        "SELECT outcome, redeliver_count, count(*) FROM tickler_event_all GROUP BY 1, 2"
    ).fetchall()
    assert by_outcome == [("delivered", 0, EVENTS)]
    per_event = raw.execute(
        "SELECT n, count(*) FROM (SELECT count(*) FILTER (WHERE action = 'delivered') AS n"
        " FROM tickler_timeline_all GROUP BY event_id) AS x GROUP BY n"
    ).fetchall()
    assert per_event == [(1, EVENTS)]
    assert [w.returncode for w in workers] == [0, 0, 0, 0], logs(tmp_path)


# -- the embeddable Worker, in threads ---------------------------------------------------------------


@pytest.fixture
def worker_settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, migrate_on_start=False, pool_size=3)


@pytest.fixture
def running(worker_settings: Settings) -> Iterator[list[Worker]]:
    """Workers a test starts; stopped after it, whatever happens."""
    workers: list[Worker] = []
    yield workers
    for worker in workers:
        worker.stop()


def test_worker_runs_single_and_group_handlers(
    store: Store, raw: psycopg.Connection[Any], worker_settings: Settings, running: list[Worker]
) -> None:
    emails = store.queues.put("emails", QueueSettings(), TEST_SETTINGS).queue
    digests = store.queues.put("digests", QueueSettings(), TEST_SETTINGS).queue
    store.events.schedule_batch(emails, [NewEvent(f"mail-{n}", {"n": n}) for n in range(5)], actor="test")
    store.events.schedule_batch(
        digests,
        [NewEvent(f"{g}-{n}", {"n": n}, group_key=g) for g in ("ana", "bo", "cy") for n in range(4)],
        actor="test",
    )

    lock = threading.Lock()
    singles: list[str] = []
    groups: list[list[Event]] = []
    worker = Worker(settings=worker_settings, name="inproc", poll_interval=1.0)

    @worker.handler("emails")
    def send(event: Event) -> None:
        with lock:
            singles.append(event.item_key)

    @worker.group_handler("digests")
    def digest(events: list[Event]) -> None:
        with lock:
            groups.append(events)

    running.append(worker)
    worker.start()
    wait_until(
        lambda: delivered(raw, "emails") == 5 and delivered(raw, "digests") == 12,
        timeout=15,
        what=lambda: f"emails {delivered(raw, 'emails')}/5, digests {delivered(raw, 'digests')}/12",
    )

    assert sorted(singles) == [f"mail-{n}" for n in range(5)]
    assert len(groups) == 3, [[e.item_key for e in g] for g in groups]
    for events in groups:
        [group] = {e.group_key for e in events}
        assert sorted(e.item_key for e in events) == [f"{group}-{n}" for n in range(4)]
        assert len({e.lease_id for e in events}) == 1
    assert sorted(e.group_key or "" for g in groups for e in g[:1]) == ["ana", "bo", "cy"]
    assert actions(store, "digests", "bo-2") == ["enqueued", "claimed", "delivered"]


def test_worker_retries_failures_and_finishes_dead_ones(
    store: Store, raw: psycopg.Connection[Any], worker_settings: Settings, running: list[Worker]
) -> None:
    flaky = store.queues.put(
        "flaky", QueueSettings(backoff_initial_seconds=0.05, backoff_multiplier=2, max_attempts=3), TEST_SETTINGS
    ).queue
    store.events.schedule_batch(
        flaky, [NewEvent("twice", {}), NewEvent("stop", {}), NewEvent("always", {}), NewEvent("fine", {})], actor="test"
    )

    calls: Counter[str] = Counter()
    lock = threading.Lock()
    worker = Worker(settings=worker_settings, name="inproc", poll_interval=1.0)

    @worker.handler("flaky")
    def handle(event: Event) -> None:
        with lock:
            calls[event.item_key] += 1
            attempt = calls[event.item_key]
        if event.item_key == "twice" and attempt <= 2:
            raise RuntimeError(f"receiver down ({attempt})")
        if event.item_key == "stop":
            raise StopDelivery("no such mailbox")
        if event.item_key == "always":
            raise ValueError("bad payload")

    running.append(worker)
    worker.start()

    def finished() -> int:
        return count(raw, "SELECT count(*) FROM tickler_event_all WHERE queue = 'flaky' AND dequeued_on IS NOT NULL")

    wait_until(lambda: finished() == 4, timeout=20, what=lambda: f"{finished()} of 4 finished; calls {dict(calls)}")

    events = {k: store.events.get("flaky", k) for k in ("twice", "stop", "always", "fine")}
    assert (events["fine"].status, events["fine"].redeliver_count) == ("delivered", 0)
    assert (events["twice"].status, events["twice"].redeliver_count) == ("delivered", 2)
    assert events["twice"].last_error is not None and "receiver down (2)" in events["twice"].last_error
    assert actions(store, "flaky", "twice") == [*TWO_FAILED_ATTEMPTS, "claimed", "delivered"]
    assert events["stop"].status == "dead" and events["stop"].redeliver_count == 1
    assert events["stop"].last_error is not None and "no such mailbox" in events["stop"].last_error
    assert actions(store, "flaky", "stop") == ["enqueued", "claimed", "dead"]
    assert events["always"].status == "dead"
    assert events["always"].last_error is not None and "bad payload" in events["always"].last_error
    assert actions(store, "flaky", "always") == [*TWO_FAILED_ATTEMPTS, "claimed", "dead"]
    assert calls == Counter({"twice": 3, "stop": 1, "always": 3, "fine": 1})


# -- on time -----------------------------------------------------------------------------------------


def test_sleeping_worker_delivers_on_time_never_early(
    store: Store, raw: psycopg.Connection[Any], worker_settings: Settings, running: list[Worker]
) -> None:
    queue = store.queues.put("ontime", QueueSettings(), TEST_SETTINGS).queue
    seen: list[str] = []
    # The safety poll is far away: only NOTIFY and the worker's own timers can deliver in time.
    worker = Worker(settings=worker_settings, name="inproc", poll_interval=60.0, refresh_interval=60.0)
    worker.handler("ontime")(lambda event: seen.append(event.item_key))
    running.append(worker)
    worker.start()

    def next_wake_set() -> bool:
        return (
            count(
                raw,
                "SELECT count(*) FROM tickler_queue WHERE name = 'ontime'"
                " AND next_wake > now() + interval '30 seconds'",
            )
            == 1
        )

    wait_until(next_wake_set, timeout=10, what="the worker never went to sleep")

    # One at a time (each wakes the sleeping worker by NOTIFY), then a batch spread over the
    # next second (one NOTIFY for its earliest; the worker's timer for the others).
    for n, delay in enumerate((0.3, 0.6, 1.0)):
        store.events.schedule(queue, NewEvent(f"single-{n}", {}, delay_seconds=delay), actor="test")
    store.events.schedule_batch(
        queue, [NewEvent(f"batch-{n}", {}, delay_seconds=0.3 + n * 0.07) for n in range(11)], actor="test"
    )

    wait_until(
        lambda: delivered(raw, "ontime") == 14, timeout=15, what=lambda: f"{delivered(raw, 'ontime')} of 14 delivered"
    )
    rows = raw.execute(
        "SELECT item_key, claimed_on >= schedule_on, extract(epoch FROM claimed_on - schedule_on)"
        " FROM tickler_event_all WHERE queue = 'ontime'"
    ).fetchall()
    early = [key for key, on_time, _ in rows if not on_time]
    assert early == []
    late = {key: lateness for key, _, lateness in rows if lateness > 5}
    assert late == {}  # generous: a missed wake-up would wait for the 60 s poll
    print(f"lateness: max {max(r[2] for r in rows) * 1000:.0f} ms")
    assert sorted(seen) == sorted(key for key, _, _ in rows)


def test_an_error_message_postgres_cannot_store_does_not_stop_the_worker(
    store: Store, raw: psycopg.Connection[Any], worker_settings: Settings, running: list[Worker]
) -> None:
    queue = store.queues.put("odd", QueueSettings(backoff_initial_seconds=60), TEST_SETTINGS).queue
    worker = Worker(settings=worker_settings, name="inproc", poll_interval=1.0)

    @worker.handler("odd")
    def handle(event: Event) -> None:
        if event.item_key == "nul":
            raise ValueError("binary reply: \x00\x01")  # text columns cannot hold NUL

    running.append(worker)
    worker.start()
    store.events.schedule(queue, NewEvent("nul", {}), actor="test")
    wait_until(
        lambda: store.events.get("odd", "nul").redeliver_count == 1,
        timeout=10,
        what=lambda: f"the failed attempt was not recorded: {store.events.get('odd', 'nul')}",
    )
    event = store.events.get("odd", "nul")
    assert event.status == "pending" and event.last_error is not None and "binary reply" in event.last_error
    # ... and the worker goes on delivering.
    store.events.schedule_batch(queue, [NewEvent(f"after-{n}", {}) for n in range(5)], actor="test")
    wait_until(lambda: delivered(raw, "odd") == 5, timeout=10, what=lambda: f"{delivered(raw, 'odd')} of 5")


def test_a_finishing_error_does_not_stall_the_dispatcher(
    database_url: str, store: Store, raw: psycopg.Connection[Any]
) -> None:
    queue = store.queues.put("odd", QueueSettings(lease_seconds=1), TEST_SETTINGS).queue

    class Buggy:
        """A deliverer with a bug: for one key it returns no outcome at all."""

        def deliver(self, queue: Queue, lease: Lease) -> Outcome:
            if lease.events[0].item_key == "bug" and lease.events[0].redeliver_count == 0:
                return None  # type: ignore[return-value]
            return Delivered()

    # One delivery at a time: capacity the finisher failed to give back would stop everything.
    config = DispatcherConfig(worker_name="buggy", concurrency=1, queue_concurrency=1, poll_interval=1.0)
    dispatcher = Dispatcher(store, WakeupListener(database_url), config, deliverers={"odd": Buggy()}).start()
    try:
        store.events.schedule(queue, NewEvent("bug", {}), actor="test")
        store.events.schedule_batch(
            queue, [NewEvent(f"after-{n}", {}, delay_seconds=0.1) for n in range(5)], actor="test"
        )
        wait_until(lambda: delivered(raw, "odd") == 6, timeout=15, what=lambda: f"{delivered(raw, 'odd')} of 6")
    finally:
        dispatcher.stop()
    # The lost outcome cost one lease expiry, and the event was delivered after it.
    assert actions(store, "odd", "bug") == ["enqueued", "claimed", "lease_expired", "claimed", "delivered"]
