"""Realistic dashboard data made through the store's own calls, with an injected clock: an hour
of deliveries and failures, dead events, leases in flight, waiting events, a paused queue.

Used by the browser tests and to take the README's screenshots (`make screenshots`).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from tickler.config import Settings
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import QueueSettings, ScheduleSpec, Store

# The key whose page the screenshots show: it failed twice, then ran out of attempts.
STORY_KEY = "welcome:ana@example.com"


def _hour(store: Store, queue: Queue, *, per_minute: int, failing: float, rng: random.Random, now: datetime) -> None:
    """Sixty minutes of traffic ending at `now`: events due each minute, claimed and finished then."""
    start = now.replace(second=0, microsecond=0)
    for minute in range(59, 0, -1):  # whole minutes, so that each minute of the chart gets one
        at = start - timedelta(minutes=minute) + timedelta(seconds=rng.uniform(1, 55))
        n = max(0, int(per_minute * (0.6 + 0.8 * rng.random())))
        events = [
            NewEvent(item_key=f"{queue.name}:{minute:02d}:{i}", data={"n": i}, schedule_on=at - timedelta(seconds=1))
            for i in range(n)
        ]
        if not events:
            continue
        store.events.schedule_batch(queue, events, actor="signup-service", now=at - timedelta(seconds=1))
        leases = store.leases.claim(queue, worker="worker-1", limit=2 * n, now=at)  # retries too
        ok = []
        for lease in leases:
            if rng.random() < failing:
                store.leases.nack(lease.lease_id, error="HTTP 503 from https://hooks.example/mail", now=at)
            else:
                ok.append(lease.lease_id)
        store.leases.ack(ok, now=at + timedelta(milliseconds=20))


def _story(store: Store, queue: Queue, now: datetime) -> None:
    """STORY_KEY: enqueued 50 minutes ago, failed three times, dead (other due events are delivered)."""
    at = now - timedelta(minutes=50)
    data = {"template": "welcome", "to": "Ana O'Neil <ana@example.com>", "locale": "pt-PT", "vars": {"plan": "Pro"}}
    story = NewEvent(item_key=STORY_KEY, data=data, max_attempts=3)
    store.events.schedule(queue, story, actor="signup-service", now=at)
    errors = [
        "HTTP 500 from https://hooks.example/mail",
        "timed out after 10 s",
        "HTTP 502 from https://hooks.example/mail",
    ]
    for error in errors:
        at += timedelta(minutes=12)
        delivered = []
        for lease in store.leases.claim(queue, worker="worker-2", limit=1000, now=at):
            if lease.events[0].item_key == STORY_KEY:
                store.leases.nack(lease.lease_id, error=error, retry_in_seconds=60, now=at + timedelta(seconds=2))
            else:
                delivered.append(lease.lease_id)
        store.leases.ack(delivered, now=at + timedelta(seconds=1))


def populate(store: Store, *, now: datetime | None = None, seed: int = 7, scale: float = 1.0) -> dict[str, Queue]:
    """Queues `emails` (steady traffic), `billing` (groups, more failures), `reports` (paused, a backlog).

    `scale` multiplies the hour's traffic (the tests keep it small; the screenshots use 1).
    """
    rng = random.Random(seed)
    now = now or datetime.now(UTC)
    queues = {
        name: store.queues.put(name, QueueSettings(max_attempts=attempts), Settings()).queue
        for name, attempts in (("emails", 2), ("billing", 5), ("reports", 3))
    }
    # Leases in flight right now (taken first, while nothing else of the queue is due).
    fresh = [NewEvent(item_key=f"receipt:{i}", data={}, group_key="acct-42" if i < 3 else None) for i in range(5)]
    store.events.schedule_batch(queues["billing"], fresh, actor="billing-service", now=now)
    store.leases.claim(queues["billing"], worker="worker-7", limit=3, lease_seconds=120, now=now)
    _hour(store, queues["emails"], per_minute=max(1, round(40 * scale)), failing=0.04, rng=rng, now=now)
    _hour(store, queues["billing"], per_minute=max(1, round(12 * scale)), failing=0.15, rng=rng, now=now)
    _story(store, queues["emails"], now)
    # Waiting work: due soon, due later, and an overdue backlog in the paused queue.
    later = [
        NewEvent(item_key=f"digest:{i}", data={}, group_key=f"user-{i % 3}", delay_seconds=600 + i) for i in range(8)
    ]
    store.events.schedule_batch(queues["billing"], later, actor="billing-service")
    backlog = [NewEvent(item_key=f"report:{i}", data={}, schedule_on=now - timedelta(minutes=12 - i)) for i in range(6)]
    store.events.schedule_batch(queues["reports"], backlog, actor="reports-service")
    store.queues.pause("reports")
    # Recurring schedules: each keeps its next occurrence waiting as an event.
    for queue, key, spec in SCHEDULES:
        store.schedules.put(queue, key, spec, actor="ops")
    return queues


SCHEDULES = (
    ("emails", "weekly-digest", ScheduleSpec("0 8 * * 1", "Europe/Lisbon", {"template": "digest"})),
    ("emails", "nightly-cleanup", ScheduleSpec("30 2 * * *", "UTC", {"older_than_days": 30}, paused=True)),
    ("emails", "trial-reminders", ScheduleSpec("0 9-17/4 * * 1-5", "America/New_York", {"kind": "trial"})),
    ("billing", "invoice-run", ScheduleSpec("0 6 1 * *", "Europe/Berlin", {"cycle": "monthly"}, group_key="invoices")),
)
