"""A failover in the middle of tickler's heavier work (SPEC §13), with the primary, its synchronous
standby and the helpers of tests/test_replica_failover.py: kill -9 of the primary and promotion
of the standby during a drain of grouped events to a real webhook receiver, and during the
history's retention drops. In each: every event answered 2xx (or committed before) is delivered,
a second delivery is a counted redelivery, and the same processes carry on on the promoted node.
"""

from __future__ import annotations

import json
import platform
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from tests import helpers_failover as failover
from tests import pg_cluster
from tests.helpers_failover import Delivered, Pair
from tests.helpers_http import QuietHandler, serving, serving_app
from tests.helpers_wait import wait_until
from tests.test_history import deliver
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.db import create_engine, unavailable_reason
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import Event, NewEvent
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.worker import Worker

pytestmark = [
    pytest.mark.replica,
    pytest.mark.skipif(not pg_cluster.available(), reason="needs PostgreSQL 15's binaries"),
]

pair = failover.pair  # the fixture

GROUPS = 400
BACKLOG = 2000


@contextmanager
def webhook_receiver(delivered: Delivered, latency: float) -> Iterator[str]:
    """A real receiver that takes `latency` seconds to answer 200 and records each event of the
    group it is sent (key, redeliver_count); yields its URL."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency)  # a receiver's own work, which keeps the drain going for a while
            for event in body["events"]:
                assert event["group_key"] == body["group_key"]
                delivered.add(event["item_key"], event["redeliver_count"])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler, backlog=64) as base:
        yield f"{base}/hooks"


def test_failover_during_a_drain_of_groups_to_a_webhook_receiver(pair: Pair) -> None:
    """A backlog of grouped events drains to a webhook receiver while clients schedule more into
    the same groups; the primary dies mid-drain. Every event arrives; each group's backlog first
    arrives in the order it was scheduled (one lease per group at a time, across the failover)."""
    url = pair.url()
    settings = Settings(database_url=url, migrate_on_start=False, pool_size=8)
    delivered = Delivered()
    answers = failover.Answers()
    with webhook_receiver(delivered, latency=0.02) as hook_url:
        setup_engine = create_engine(url, pool_size=1)
        store = Store(setup_engine)
        token = failover.admin(store)
        wanted = QueueSettings(
            delivery_mode="webhook",
            webhook_url=hook_url,
            webhook_timeout_seconds=1,
            lease_seconds=2,
            backoff_initial_seconds=0.05,
        )
        hooks = store.queues.put("hooks", wanted, Settings()).queue
        backlog = [NewEvent(f"b{n}", {"n": n}, group_key=f"g{n % GROUPS}") for n in range(BACKLOG)]
        store.events.schedule_batch(hooks, backlog, actor="test")  # committed: as good as a 202
        setup_engine.dispose()

        worker = Worker(
            settings=settings,
            name="drain",
            deliver_webhooks=True,
            poll_interval=0.5,
            reap_interval=0.2,
            webhook_concurrency=4,
        )
        app = create_app(settings, configure_logs=False)
        worker.start()
        try:
            with serving_app(app) as base, failover.scheduling(base, token, answers, queue="hooks", groups=50) as stop:
                wait_until(
                    lambda: len(delivered.keys()) >= 200 and len(answers.accepted()) >= 50,
                    timeout=30,
                    what="the drain under way",
                )
                killed, promoted = failover.fail_over(pair, answers)
                drained_at_kill = sum(1 for key, _, at in delivered.snapshot() if key.startswith("b") and at <= killed)
                wait_until(lambda: delivered.after(promoted), timeout=30, what="a delivery after promotion")
                after = len(answers.accepted(after=promoted))
                wait_until(lambda: len(answers.accepted(after=promoted)) >= after + 50, what="scheduling after")
                stop()
            accepted = failover.check_answers(answers) | {event.item_key for event in backlog}
            duplicates = failover.check_delivered(url, "hooks", accepted, delivered)
        finally:
            worker.stop()
            close_app(app)

    assert drained_at_kill < BACKLOG  # the primary died during the drain
    first_arrivals: dict[str, list[int]] = {}
    seen: set[str] = set()
    for key, _, _ in delivered.snapshot():
        if key.startswith("b") and key not in seen:
            seen.add(key)
            n = int(key[1:])
            first_arrivals.setdefault(f"g{n % GROUPS}", []).append(n)
    assert all(numbers == sorted(numbers) for numbers in first_arrivals.values())
    failover.report(
        "failover_during_drain",
        {
            "machine": f"{platform.machine()}, {failover.cpus()} cores, loopback, PostgreSQL 15, fsync off",
            "backlog": BACKLOG,
            "backlog_delivered_before_kill": drained_at_kill,
            "events_answered_2xx_or_committed": len(accepted),
            "delivered_twice": len(duplicates),
            "kill_to_promotion_seconds": round(promoted - killed, 3),
        },
    )


def test_failover_during_retention_drops(pair: Pair) -> None:
    """A maintenance pass after another, its clock a day further each time, drops the history
    partitions of a one-day queue (DROP TABLE under the parents' ACCESS EXCLUSIVE lock) while
    clients schedule and a worker delivers; the primary dies among the passes. The passes go on
    on the promoted node, the partition catalog names only tables that exist, the dropped days'
    events are gone and every accepted event is delivered and kept."""
    url = pair.url()
    settings = Settings(database_url=url, migrate_on_start=False, pool_size=8)
    engine = create_engine(url, pool_size=2)
    store = Store(engine)
    token = failover.admin(store)
    # the live traffic's days are kept far longer than the clock of the passes goes
    jobs = store.queues.put("jobs", QueueSettings(lease_seconds=2, retention_days=3650), Settings()).queue
    old = store.queues.put("old", QueueSettings(retention_days=1), Settings()).queue
    [(midnight,)] = pair.primary.execute(
        "SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'", "tickler"
    )
    today: datetime = midnight.astimezone(UTC)
    old_keys = [f"old{day}-{n}" for day in range(4) for n in range(10)]
    for day in range(4):  # today and the days ahead that have partitions
        deliver(store, old, old_keys[day * 10 : (day + 1) * 10], at=today + timedelta(days=day, hours=1))
    # A first pass with the clock ahead settles today before the live traffic writes it: today
    # gets a part for each queue with rows in its `_rest` (a pass never attaches one to a day
    # being written), so the long queue's part keeps today's table when the short queue's goes.
    deliver(store, jobs, ["seed"])
    store.history.maintain(now=today + timedelta(days=3))

    passes: list[tuple[float, tuple[str, ...]]] = []
    unexpected: list[BaseException] = []
    stop_passes = threading.Event()

    def maintain() -> None:
        day = 4
        while not stop_passes.is_set():
            try:
                done = store.history.maintain(now=today + timedelta(days=day))
            except sa.exc.DBAPIError as error:
                if unavailable_reason(error) is None:
                    unexpected.append(error)
                    return
                stop_passes.wait(0.1)  # no primary yet: the next pass tries again
                continue
            passes.append((time.monotonic(), done.dropped))
            day += 1

    delivered = Delivered()
    worker = Worker(settings=settings, name="retention", poll_interval=0.5, reap_interval=0.2)

    @worker.handler("jobs")
    def handle(event: Event) -> None:
        delivered.add(event.item_key, event.redeliver_count)

    answers = failover.Answers()
    app = create_app(settings, configure_logs=False)
    worker.start()
    passer = threading.Thread(target=maintain, daemon=True)
    try:
        with serving_app(app) as base, failover.scheduling(base, token, answers) as stop:
            passer.start()
            wait_until(
                lambda: sum(1 for _, dropped in passes if dropped) >= 3 and len(delivered.snapshot()) >= 50,
                timeout=30,
                what="drops and deliveries before",
            )
            killed, promoted = failover.fail_over(pair, answers)
            wait_until(
                lambda: sum(1 for at, dropped in passes if dropped and at > promoted) >= 3,
                timeout=30,
                what=lambda: f"drops after promotion: {unexpected}",
            )
            wait_until(lambda: delivered.after(promoted) >= 50, timeout=30, what="deliveries after promotion")
            stop()
            stop_passes.set()
            passer.join(timeout=30)
        assert unexpected == []
        accepted = failover.check_answers(answers)
        duplicates = failover.check_delivered(url, "jobs", accepted, delivered)
        # a pass cut short by the failover left nothing half done: its transaction is gone
        assert (
            pair.standby.execute(
                "SELECT name FROM tickler_history_partition WHERE to_regclass(name) IS NULL", "tickler"
            )
            == []
        )
        for key in old_keys:  # the one-day queue's days are past: dropped
            with pytest.raises(NotFound):
                store.events.get("old", key)
    finally:
        stop_passes.set()
        worker.stop()
        close_app(app)
        store.engine.dispose()
    dropped = [name for _, names in passes for name in names]
    failover.report(
        "failover_during_retention_drops",
        {
            "passes": len(passes),
            "tables_dropped": len(dropped),
            "events_answered_2xx": len(accepted),
            "delivered_twice": len(duplicates),
            "kill_to_promotion_seconds": round(promoted - killed, 3),
        },
    )
