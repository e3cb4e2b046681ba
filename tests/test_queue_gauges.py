"""Per-queue gauges in /metrics (SPEC §7): values, the same from every process, and read through
counters and indexes (plans checked at size), never by scanning events."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import auth
from tests.helpers import plan_nodes, schedule
from tests.test_plans import plan
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store

NAMES = ("pending", "due", "in_flight", "dead", "oldest_due_age_seconds", "paused")


def scrape(client: FlaskClient) -> dict[str, dict[str, float]]:
    """{gauge short name: {queue: value}} of the tickler_queue_* gauges in /metrics."""
    response = client.get("/metrics")
    assert response.status_code == 200
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        if family.name.startswith("tickler_queue_") and family.name != "tickler_queue_gauges_up":
            short = family.name.removeprefix("tickler_queue_")
            found[short] = {sample.labels["queue"]: sample.value for sample in family.samples}
        if family.name == "tickler_queue_gauges_up":
            assert [sample.value for sample in family.samples] == [1.0]
    return found


def load(client: FlaskClient, admin_token: str) -> None:
    """emails: 2 waiting, 3 due (one 2 minutes late), 1 in flight, 1 dead; billing: empty, paused."""
    for name in ("emails", "billing"):
        assert client.put(f"/v1/queues/{name}", json={}, headers=auth(admin_token)).status_code == 201
    assert client.post("/v1/queues/billing/pause", headers=auth(admin_token)).status_code == 200
    h = auth(admin_token)
    # one event to kill and one to hold in flight, claimed before anything else is due
    assert schedule(client, admin_token, "dead", max_attempts=1).status_code == 202
    assert schedule(client, admin_token, "flying").status_code == 202
    leases = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 10}, headers=h).json["leases"]
    by_key = {lease["events"][0]["item_key"]: lease["lease_id"] for lease in leases}
    assert client.post(f"/v1/leases/{by_key['dead']}/nack", json={"error": "x"}, headers=h).status_code == 200
    for key in ("later:1", "later:2"):
        assert schedule(client, admin_token, key, delay_seconds=3600).status_code == 202
    assert schedule(client, admin_token, "late", schedule_on="2020-01-01T00:00:00Z").status_code == 202
    for key in ("due:1", "due:2"):
        assert schedule(client, admin_token, key).status_code == 202


def test_gauges_in_metrics(client: FlaskClient, admin_token: str) -> None:
    load(client, admin_token)
    gauges = scrape(client)
    assert set(gauges) == set(NAMES)
    assert gauges["pending"] == {"emails": 5, "billing": 0}
    assert gauges["due"] == {"emails": 3, "billing": 0}
    assert gauges["in_flight"] == {"emails": 1, "billing": 0}
    assert gauges["dead"] == {"emails": 1, "billing": 0}
    assert gauges["paused"] == {"emails": 0, "billing": 1}
    assert gauges["oldest_due_age_seconds"]["billing"] == 0
    # the late event came due on 2020-01-01: years ago
    assert gauges["oldest_due_age_seconds"]["emails"] > 5 * 365 * 86400
    # the gauges agree with the queue's own counts
    counts = client.get("/v1/queues/emails", headers=auth(admin_token)).json["counts"]
    assert {k: counts[k] for k in ("pending", "due", "in_flight", "dead")} == {
        k: gauges[k]["emails"] for k in ("pending", "due", "in_flight", "dead")
    }


def test_oldest_due_age_follows_the_database_clock(client: FlaskClient, admin_token: str, store: Store) -> None:
    load(client, admin_token)
    late = store.events.get("emails", "late")
    [emails] = store.queues.gauges(["emails"], now=late.schedule_on + timedelta(seconds=90))
    # at that time only the late event is due (the others were scheduled years after it)
    assert (emails.due, emails.oldest_due_age_seconds) == (1, 90.0)
    [before] = store.queues.gauges(["emails"], now=late.schedule_on - timedelta(seconds=1))
    assert (before.due, before.oldest_due_age_seconds) == (0, 0.0)


@pytest.fixture
def second_app(settings: Settings) -> Iterator[Flask]:
    """Another process's app: its own engine, its own metric registries."""
    app = create_app(settings, configure_logs=False)
    yield app
    close_app(app)


def test_every_process_answers_the_same_gauges(client: FlaskClient, admin_token: str, second_app: Flask) -> None:
    load(client, admin_token)
    first, second = scrape(client), scrape(second_app.test_client())
    for name in ("pending", "due", "in_flight", "dead", "paused"):
        assert first[name] == second[name], name


def _seq_scans(plan_json: str) -> list[str]:
    """Relations read by a sequential scan anywhere in a JSON plan."""
    nodes = plan_nodes(json.loads(plan_json))
    return [node.get("Relation Name", "?") for node in nodes if node.get("Node Type") == "Seq Scan"]


def test_gauge_and_retry_plans_stay_on_indexes_at_size(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    make_queue("billing")
    for start in range(0, 30_000, 10_000):
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"k{i}", data={}, group_key=f"g{i % 50}") for i in range(start, start + 10_000)],
            actor="load",
        )
    # most of them finished long ago (delivered, some dead), a few still open
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w',"
        " outcome = CASE WHEN id % 100 = 0 THEN 'dead' ELSE 'delivered' END WHERE id % 1000 <> 1"
    )
    raw.execute("ANALYZE tickler_event")
    raw.execute("ANALYZE tickler_event_history")
    raw.execute("ANALYZE tickler_timeline")
    # Finished events and the timeline are kept in day partitions: a sequential scan of an empty
    # one (the days ahead) is the planner's fair choice, of one holding rows it is not.
    populated = {"tickler_event"} | {
        row[0]
        for row in raw.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM tickler_event_history"
            " UNION SELECT DISTINCT tableoid::regclass::text FROM tickler_timeline"
        )
    }
    gauges = plan(raw, "queue_gauges", {"names": None, "now": None})
    # (the counters table is a few rows per queue: a sequential scan of it is the planner's fair choice)
    assert not populated & set(_seq_scans(gauges)), gauges
    assert "tickler_event_history" not in gauges and "tickler_timeline" not in gauges  # gauges read no history
    assert "tickler_event_open_schedule" in gauges
    retry = plan(
        raw,
        "retry_matching",
        {"queue": "emails", "actor": "ops", "group_key": None, "prefix": "k1", "prefix_end": "k2", "now": None},
    )
    # dead events through the history's index of dead events (tickler_event_history_dead, in each day)
    assert "_queue_item_key_group_key_idx" in retry and not populated & set(_seq_scans(retry)), retry
    one = plan(
        raw,
        "retry_event",
        {
            "queue": "emails",
            "item_key": "k100",
            "actor": "ops",
            "schedule_on": None,
            "delay_seconds": None,
            "now": None,
        },
    )
    assert not populated & set(_seq_scans(one)), one
    # and the values are right at that size
    [emails] = store.queues.gauges(["emails"])
    assert (emails.pending, emails.due, emails.dead) == (30, 30, 300)
