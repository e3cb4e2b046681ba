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
from tests.workers.maintaining import maintained
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


BATCH = 2000


def test_kill_9_mid_maintenance_loses_and_duplicates_nothing(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], database_url: str
) -> None:
    """A maintenance pass gives rows of the DEFAULT partition their day in one transaction: killed
    at any moment, every row is in one place once, its day's counters equal its rows, and the
    next pass finishes the work."""
    make_queue("emails")
    for round_ in range(3):  # kill it three times, at three moments of its work
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.workers.maintaining", database_url, "emails", str(BATCH)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        target = counted(raw) + BATCH * (2 + round_) + 1

        def progressed(target: int = target) -> bool:
            return counted(raw) >= target

        try:
            wait_until(progressed, timeout=60, what="the process writing and maintaining history")
        finally:  # also when the wait fails: a writer left running would write into the next tests
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        history_is_whole(raw)

    # a pass after the last kill (the killed process's backend may hold its locks a little longer)
    wait_until(lambda: maintained(store), timeout=60, what="a maintenance pass after the kills")
    history_is_whole(raw)
    assert one(raw, "SELECT count(*) FROM tickler_event_history_default") == 0


def counted(raw: psycopg.Connection[Any]) -> int:
    """The rows written, by the history's counters (kept in the same transactions: equal to the
    rows, as history_is_whole checks). Not a count(*) of the history: polled every 50 ms, its
    locks on every partition kept the pass from the ACCESS EXCLUSIVE lock it needs to attach the
    next day, which it gives up on (lock_timeout) and tries again: rounds took up to a minute."""
    return int(one(raw, "SELECT coalesce(sum(n), 0) FROM tickler_history_count WHERE queue = 'emails'"))


def history_is_whole(raw: psycopg.Connection[Any]) -> None:
    """Whole batches, each once; each row in its day's partition or in DEFAULT; counters = rows."""
    rows, distinct, top = raw.execute(
        "SELECT count(*), count(DISTINCT id), coalesce(max(id), -1) FROM tickler_event_history WHERE queue = 'emails'"
    ).fetchone()  # type: ignore[misc]
    assert rows == distinct == top + 1 and rows % BATCH == 0, (rows, distinct, top)
    misplaced = one(
        raw,
        "SELECT count(*) FROM tickler_event_history AS h JOIN tickler_history_partition AS p"
        " ON p.name = h.tableoid::regclass::text"
        " WHERE h.queue = 'emails'"
        " AND NOT (h.dequeued_on >= coalesce(p.day_from, '-infinity') AND h.dequeued_on < p.day_to)",
    )
    assert misplaced == 0
    kept = dict(
        raw.execute(
            "SELECT day, sum(n)::bigint FROM tickler_history_count WHERE queue = 'emails' GROUP BY 1 HAVING sum(n) <> 0"
        ).fetchall()
    )
    counted = dict(
        raw.execute(
            "SELECT (dequeued_on AT TIME ZONE 'UTC')::date, count(*) FROM tickler_event_history"
            " WHERE queue = 'emails' GROUP BY 1"
        ).fetchall()
    )
    assert kept == counted
