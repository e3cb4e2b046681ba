"""Shared by the pipeline tests: the sources this database can be read with, and a builder of event
histories written the way the store writes them (the fixtures are in tests/pipeline_fixtures.py)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tickler.pipeline import db as pdb
from tickler.pipeline.spark import jdbc_jar

ARCHIVE_TABLES = "tickler_archived_key, tickler_archive_item, tickler_archive_run"

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java")


def sources(url: str) -> list[str]:
    """The ways this database can be read: the snapshot always, JDBC when on TCP with the jar."""
    found = ["snapshot"]
    if pdb.endpoint(url).is_tcp and jdbc_jar() is not None:
        found.append("jdbc")
    return found


def at(text: str) -> datetime:
    """'2026-11-02 10:00:05' in UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def add_queue(conn: psycopg.Connection[Any], name: str, max_attempts: int = 5) -> None:
    conn.execute(
        "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,"
        " backoff_max_seconds, backoff_multiplier) VALUES (%s, 'pull', 30, %s, 1, 60, 2)",
        [name, max_attempts],
    )


@dataclass
class Event:
    """One event's life, entry by entry, in the shapes the store and the delivery engine write."""

    queue: str
    item_key: str
    enqueued_on: datetime
    schedule_on: datetime
    principal: str = "signup-service"
    group_key: str | None = None
    max_attempts: int = 5
    redeliver_count: int = 0
    outcome: str | None = None
    dequeued_on: datetime | None = None
    dequeued_by: str | None = None
    entries: list[tuple[datetime, str, str, datetime | None, dict[str, Any]]] = field(default_factory=list)
    _lease: int = 0

    def __post_init__(self) -> None:
        details = {"max_attempts": self.max_attempts} | ({"group_key": self.group_key} if self.group_key else {})
        self.entries.append((self.enqueued_on, "enqueued", self.principal, self.schedule_on, details))

    def _lease_id(self) -> str:
        return f"00000000-0000-0000-0000-{self._lease:012d}"

    def reschedule(self, when: datetime, schedule_on: datetime) -> Event:
        self.schedule_on = schedule_on
        self.entries.append((when, "rescheduled", self.principal, schedule_on, {}))
        return self

    def claim(self, when: datetime, worker: str = "billing/worker-1") -> Event:
        self._lease += 1
        details = {"lease_id": self._lease_id(), "attempt": self.redeliver_count + 1,
                   "lease_expires_at": (when + timedelta(seconds=30)).isoformat()}  # fmt: skip
        self.entries.append((when, "claimed", worker, self.schedule_on, details))
        return self

    def deliver(self, when: datetime, worker: str = "billing/worker-1") -> Event:
        details = {"lease_id": self._lease_id(), "attempt": self.redeliver_count + 1}
        self.entries.append((when, "delivered", worker, self.schedule_on, details))
        return self._finish(when, "delivered", worker)

    def fail(self, when: datetime, retry_at: datetime, worker: str = "billing/worker-1") -> Event:
        self.redeliver_count += 1
        self.schedule_on = retry_at  # the backoff moves the event's own schedule
        details = {"lease_id": self._lease_id(), "attempt": self.redeliver_count, "error": "HTTP 500",
                   "retry_at": retry_at.isoformat()}  # fmt: skip
        self.entries.append((when, "failed", worker, retry_at, details))
        return self

    def expire(self, when: datetime) -> Event:
        self.redeliver_count += 1
        details = {"lease_id": self._lease_id(), "claimed_by": "billing/worker-1", "expired_at": when.isoformat()}
        self.entries.append((when, "lease_expired", "tickler", self.schedule_on, details))
        return self

    def die(self, when: datetime, actor: str = "billing/worker-1") -> Event:
        details = {"reason": "attempts exhausted", "attempt": self.redeliver_count + 1, "error": "HTTP 500"}
        self.entries.append((when, "dead", actor, self.schedule_on, details))
        return self._finish(when, "dead", actor)

    def cancel(self, when: datetime) -> Event:
        self.entries.append((when, "cancelled", self.principal, self.schedule_on, {}))
        return self._finish(when, "cancelled", self.principal)

    def _finish(self, when: datetime, outcome: str, actor: str) -> Event:
        self.outcome, self.dequeued_on, self.dequeued_by = outcome, when, actor
        return self


def save(conn: psycopg.Connection[Any], events: list[Event]) -> dict[str, int]:
    """Insert the events and their timelines; return {item_key: event id} (the last event of a key)."""
    ids = {}
    for event in events:
        row = conn.execute(
            "INSERT INTO tickler_event (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by,"
            " dequeued_on, dequeued_by, outcome, redeliver_count, max_attempts)"
            " VALUES (%s, %s, %s, %s, '{}', %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            [event.queue, event.item_key, event.group_key, event.schedule_on, event.enqueued_on, event.principal,
             event.dequeued_on, event.dequeued_by, event.outcome, event.redeliver_count, event.max_attempts],
        ).fetchone()  # fmt: skip
        assert row is not None
        ids[event.item_key] = row[0]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [(event.queue, event.item_key, row[0], when, action, actor, schedule, json.dumps(details))
                 for when, action, actor, schedule, details in event.entries],
            )  # fmt: skip
    return ids


# The history most tests read: period 2026-11-01 to 2026-11-08, queues emails and sms.
PERIOD = ("2026-11-01", "2026-11-08")
EMAILS_LATENESS_NOV2 = [1, 2, 3, 5, 6, 7, 8, 9, 10, 120]  # seconds, e1..e10
X1_LATENESS = 70


def known_history() -> list[Event]:
    """Events with known answers (see the expectations in test_pipeline_report)."""
    events = []
    enqueued = at("2026-11-01 08:00:00")
    asked = at("2026-11-02 10:00:00")
    for n, late in zip(range(1, 11), EMAILS_LATENESS_NOV2, strict=True):
        event = Event("emails", f"e{n}", enqueued, asked, group_key="bob" if n == 4 else None)
        if n == 3:
            # the client moved it: lateness counts from the new time, not the first one
            event.reschedule(at("2026-11-02 09:00:00"), asked + timedelta(minutes=30))
            event.claim(asked + timedelta(minutes=30)).deliver(asked + timedelta(minutes=30, seconds=late))
        elif n == 4:
            # one failed attempt: its backoff moves the event's schedule, not the client's
            event.claim(asked).fail(asked + timedelta(seconds=5), retry_at=asked + timedelta(seconds=60))
            event.claim(asked + timedelta(seconds=60)).deliver(asked + timedelta(seconds=late))
        else:
            event.claim(asked).deliver(asked + timedelta(seconds=late))
        events.append(event)
    for key in ("c1", "c2"):
        events.append(Event("emails", key, enqueued, at("2026-11-05 10:00:00")).cancel(at("2026-11-03 12:00:00")))
    d1 = Event("emails", "d1", enqueued, at("2026-11-03 10:00:00"), principal="billing", group_key="ana",
               max_attempts=2)  # fmt: skip
    d1.claim(at("2026-11-03 10:00:00")).fail(at("2026-11-03 10:00:05"), retry_at=at("2026-11-03 10:01:00"))
    d1.claim(at("2026-11-03 10:01:00")).die(at("2026-11-03 10:01:05"))
    x1 = Event("emails", "x1", enqueued, at("2026-11-03 11:00:00"), principal="billing", group_key="ana")
    x1.claim(at("2026-11-03 11:00:00")).expire(at("2026-11-03 11:00:30"))
    x1.claim(at("2026-11-03 11:01:00")).deliver(at("2026-11-03 11:00:00") + timedelta(seconds=X1_LATENESS))
    events += [d1, x1]
    # still open: never archived; e1's key again, so that key has history both archived and live
    events.append(Event("emails", "pending", enqueued, at("2026-12-01 00:00:00")))
    events.append(Event("emails", "e1", at("2026-11-04 08:00:00"), at("2026-12-01 00:00:00")))
    # sms: one enqueued before the period, one entry after it
    s1 = Event("sms", "s1", at("2026-11-02 09:00:00"), at("2026-11-02 09:30:00"))
    s1.claim(at("2026-11-02 09:30:00")).deliver(at("2026-11-02 09:30:00.500000"))
    s2 = Event("sms", "s2", at("2026-10-30 09:00:00"), at("2026-11-02 09:00:00"))
    s2.claim(at("2026-11-02 09:00:00")).deliver(at("2026-11-02 09:00:01"))
    s3 = Event("sms", "s3", at("2026-11-09 09:00:00"), at("2026-11-10 09:00:00"))
    return [*events, s1, s2, s3]


def check_known_answers(tables: dict[str, list[dict[str, Any]]]) -> None:
    """The report of known_history() over PERIOD, whether live or archived."""
    emails = _by_day(tables["daily"], "emails")
    assert sorted(emails) == ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    assert emails["2026-11-01"]["enqueued"] == 15
    assert emails["2026-11-04"]["enqueued"] == 1
    nov2 = emails["2026-11-02"]
    assert (nov2["rescheduled"], nov2["claimed"], nov2["delivered"], nov2["failed"]) == (1, 11, 10, 1)
    # the rescheduled event counts from its new time, the retried one from the client's time
    assert (nov2["lateness_p50_s"], nov2["lateness_p95_s"], nov2["lateness_p99_s"]) == (6, 120, 120)
    assert nov2["attempts_avg"] == pytest.approx(1.1)
    assert nov2["attempts_max"] == 2
    assert nov2["redelivered_share"] == pytest.approx(0.1)
    assert nov2["failure_rate"] == pytest.approx(1 / 11)
    nov3 = emails["2026-11-03"]
    counts = {k: nov3[k] for k in ("cancelled", "claimed", "failed", "dead", "lease_expired", "delivered")}
    assert counts == {"cancelled": 2, "claimed": 4, "failed": 1, "dead": 1, "lease_expired": 1, "delivered": 1}
    assert nov3["failed_attempts"] == 3  # failed + dead by the worker + lease expiry
    assert nov3["failure_rate"] == pytest.approx(0.75)
    assert nov3["lateness_p50_s"] == 70

    sms = _by_day(tables["daily"], "sms")
    assert sorted(sms) == ["2026-11-02"]  # s2 was enqueued before the period, s3 after it
    assert (sms["2026-11-02"]["enqueued"], sms["2026-11-02"]["delivered"]) == (1, 2)
    assert (sms["2026-11-02"]["lateness_p50_s"], sms["2026-11-02"]["lateness_p95_s"]) == (0.5, 1.0)
    assert sms["2026-11-02"]["enqueue_to_delivery_p50_s"] == 1800.5
    assert sms["2026-11-02"]["enqueue_to_delivery_p99_s"] == 3 * 86400 + 1

    summary = {row["queue"]: row for row in tables["summary"]}
    assert (summary["emails"]["enqueued"], summary["emails"]["delivered"]) == (16, 11)
    assert (summary["emails"]["lateness_p50_s"], summary["emails"]["lateness_p99_s"]) == (7, 120)
    assert summary["emails"]["failure_rate"] == pytest.approx(4 / 15)
    assert summary["emails"]["redelivered_share"] == pytest.approx(2 / 11)

    histogram = {(r["queue"], r["label"]): r["deliveries"] for r in tables["lateness_histogram"]}
    assert histogram == {
        ("emails", "1-5 s"): 3, ("emails", "5-30 s"): 6, ("emails", "1-5 min"): 2,
        ("sms", "< 1 s"): 1, ("sms", "1-5 s"): 1,
    }  # fmt: skip
    # the dead event and its reason; attempts per delivered event; deliveries by hour of day
    assert [(r["queue"], r["reason"], r["dead"]) for r in tables["dead_reasons"]] == [
        ("emails", "attempts exhausted", 1)
    ]
    attempts = {(r["queue"], r["attempts"]): r["deliveries"] for r in tables["attempts_histogram"]}
    assert attempts == {("emails", 1): 9, ("emails", 2): 2, ("sms", 1): 2}
    hourly = {(r["queue"], r["hour"]): (r["delivered"], r["enqueued"]) for r in tables["hourly"]}
    assert hourly[("sms", 9)] == (2, 1) and hourly[("emails", 8)] == (0, 16)
    assert sum(r["delivered"] for r in tables["hourly"]) == 13
    top = [(r["kind"], r["queue"], r["name"], r["failures"], r["events"]) for r in tables["top_failures"]]
    assert top == [
        ("group", "emails", "ana", 3, 2),
        ("group", "emails", "bob", 1, 1),
        ("principal", None, "billing", 3, 2),
        ("principal", None, "signup-service", 1, 1),
    ]


def _by_day(rows: list[dict[str, Any]], queue: str) -> dict[str, dict[str, Any]]:
    return {row["day"].isoformat(): row for row in rows if row["queue"] == queue}
