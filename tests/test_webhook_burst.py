"""A burst of webhook events due at one instant reaches a modest receiver — a plain standard-library
ThreadingHTTPServer (listen backlog 5, HTTP/1.0: a new connection per request) — whole, with no
failed attempt, from a worker process running with the defaults."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tests.receiver import modest_receiver
from tests.workers.spawn import logs, start_worker, stop_workers
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store

BURST = 200


def listening(raw: psycopg.Connection[Any]) -> bool:
    """A worker's LISTEN connection is up: it is asleep and will be woken by the due time."""
    row = raw.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tickler-listen'").fetchone()
    return row is not None and row[0] > 0


@pytest.mark.slow
def test_a_burst_due_at_one_instant_reaches_a_plain_receiver_whole_with_no_failed_attempt(
    database_url: str, store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with modest_receiver() as (arrived, url):
        queue = make_queue("hooks", delivery_mode="webhook", webhook_url=url)  # every other setting: default
        worker = start_worker(database_url, tmp_path, name="w", webhooks=True)
        try:
            wait_until(lambda: listening(raw), timeout=60, what=lambda: logs(tmp_path))
            row = raw.execute("SELECT now()").fetchone()
            assert row is not None
            due = row[0] + timedelta(seconds=1)
            store.events.schedule_batch(
                queue, [NewEvent(f"burst-{n}", {"n": n}, schedule_on=due) for n in range(BURST)], actor="test"
            )
            wait_until(
                lambda: (
                    raw.execute("SELECT count(*) FROM tickler_event_all WHERE dequeued_on IS NOT NULL").fetchone()
                    == (BURST,)
                ),
                timeout=60,
                what=lambda: f"{len(arrived)} arrived\n{logs(tmp_path)}",
            )
        finally:
            stop_workers([worker])
    failures = raw.execute(
        "SELECT action, details->>'error' FROM tickler_timeline WHERE action IN ('failed', 'dead', 'lease_expired')"
    ).fetchall()
    assert failures == []
    outcomes = raw.execute("SELECT outcome, redeliver_count, count(*) FROM tickler_event_all GROUP BY 1, 2").fetchall()
    assert outcomes == [("delivered", 0, BURST)]
    assert len(arrived) == BURST
    # Lateness is not asserted here (it moves with the machine's load); shown for the record.
    print(f"burst lateness: last arrival {max(arrived.values()) - due.timestamp():.3f} s after the due time")
