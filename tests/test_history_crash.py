"""kill -9 in the middle of finishing events: a finish and its move into history are one
statement, so nothing is lost, duplicated or counted twice, and the events the dead process held
are delivered by the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers_wait import wait_until
from tests.test_history import counters, one
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store

ROOT = Path(__file__).resolve().parents[1]
EVENTS = 3000


def finished(raw: psycopg.Connection[Any]) -> int:
    return int(one(raw, "SELECT count(*) FROM tickler_event_history WHERE queue = 'emails'"))


def test_kill_9_mid_finish_loses_and_duplicates_nothing(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], database_url: str
) -> None:
    queue = make_queue("emails", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(EVENTS)], actor="app")
    for round_ in range(3):  # kill it three times, at three moments of its work
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.workers.finishing", database_url, "emails"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        target = finished(raw) + 200 + 37 * round_

        def progressed(target: int = target) -> bool:
            return finished(raw) >= target

        wait_until(progressed, timeout=60, what="the process finishing events")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

        # every event in exactly one place, once; the counters equal the rows
        assert one(raw, "SELECT count(*) FROM tickler_event_all WHERE queue = 'emails'") == EVENTS
        assert one(raw, "SELECT count(DISTINCT id) FROM tickler_event_all WHERE queue = 'emails'") == EVENTS
        counters(raw, "emails")
        # each finished event has exactly the one entry of its finish; an open one none
        ends = dict(
            raw.execute(
                "SELECT e.id, count(t.id) FROM tickler_event_all AS e LEFT JOIN tickler_timeline_all AS t"
                " ON t.event_id = e.id AND t.action IN ('delivered', 'dead')"
                " WHERE e.queue = 'emails' GROUP BY e.id"
            ).fetchall()
        )
        done = {row[0] for row in raw.execute("SELECT id FROM tickler_event_history WHERE queue = 'emails'")}
        assert {i for i, n in ends.items() if n == 1} == done
        assert {n for i, n in ends.items() if i not in done} <= {0}

    # what the killed processes held comes back when their leases run out, and is finished once
    now = one(raw, "SELECT now()") + timedelta(minutes=1)
    store.leases.expire(now=now)
    while leases := store.leases.claim(queue, worker="after", limit=500, now=now):
        store.leases.ack([lease.lease_id for lease in leases], now=now)
    assert counters(raw, "emails").get("open", 0) == 0
    assert one(raw, "SELECT count(DISTINCT id) FROM tickler_event_history WHERE queue = 'emails'") == EVENTS
    assert one(raw, "SELECT count(*) FROM tickler_timeline_all WHERE action IN ('delivered', 'dead')") == EVENTS
