"""Upcoming load (SPEC §7): the forecast of a queue equals a brute-force count of its pending
events by when they fall due, through reschedules and cancels that move events between buckets,
and deliveries and deaths that take them out; bad arguments are 400 problems."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import EventChanges, Store
from tickler.scheduler.store.forecast import BUCKETS, Forecast

NOW = datetime.now(UTC).replace(second=30, microsecond=0)


def brute_force(raw: psycopg.Connection[Any], queue: str, found: Forecast, bucket: str, now: datetime) -> Forecast:
    """The same forecast, counted row by row."""
    width = BUCKETS[bucket]
    rows = raw.execute(
        "SELECT schedule_on FROM tickler_event WHERE queue = %s AND dequeued_on IS NULL AND schedule_on >= %s",
        [queue, now],
    ).fetchall()
    end = found.buckets[-1].start + width
    counts = {b.start: 0 for b in found.buckets}
    later = 0
    for (at,) in rows:
        if at >= end:
            later += 1
        else:
            counts[max(s for s in counts if s <= at)] += 1
    return Forecast(found.start, width, list(counts.values()), later, True)


def seed(store: Store, queue: Queue, offsets_minutes: list[float]) -> None:
    at = [NOW + timedelta(minutes=m) for m in offsets_minutes]
    events = [NewEvent(item_key=f"k{n}", data={}, schedule_on=when) for n, when in enumerate(at)]
    store.events.schedule_batch(queue, events, actor="test")


@pytest.mark.parametrize("bucket", ["minute", "hour"])
def test_the_forecast_equals_a_brute_force_count_through_moves_and_finishes(
    bucket: str, store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("jobs", max_attempts=1)
    # Due already (the first minute's earlier seconds too), in the window, at its edge, later.
    offsets = [-90, -0.4, -0.1, 0.2, 0.4, 1, 2.5, 59, 61, 119, 23 * 60, 24 * 60 - 1, 24 * 60 + 1, 50 * 60, 9000]
    seed(store, queue, offsets)
    other = make_queue("other")
    seed(store, other, [1, 2, 3])  # another queue's events are not this one's load

    def check(now: datetime = NOW) -> None:
        found = store.forecasts.forecast("jobs", hours=24, bucket=bucket, now=now)
        assert found.exact
        assert len(found.buckets) == (24 * 60 if bucket == "minute" else 24)
        assert found == brute_force(raw, "jobs", found, bucket, now)

    check()
    # Reschedules move events between buckets, and out to later and back.
    store.events.change("jobs", "k3", EventChanges(schedule_on=NOW + timedelta(minutes=300)), actor="t")
    store.events.change("jobs", "k12", EventChanges(schedule_on=NOW + timedelta(minutes=5)), actor="t")
    store.events.change("jobs", "k6", EventChanges(schedule_on=NOW + timedelta(days=30)), actor="t")
    check()
    # A cancel takes an event out.
    store.events.cancel("jobs", "k7", actor="t")
    check()
    # Delivered and dead events leave it: claim what is due at a later clock, ack one, fail the other.
    later = NOW + timedelta(minutes=3)
    leases = store.leases.claim(queue, worker="w", limit=100, now=later)
    assert len(leases) >= 2
    store.leases.ack([leases[0].lease_id], now=later)
    store.leases.nack(leases[1].lease_id, error="boom", dead=True, now=later)
    check(later)
    # The counters' slots folded together change nothing.
    store.forecasts.fold()
    check(later)


def test_the_api_answers_the_forecast_and_refuses_bad_arguments(
    client: FlaskClient, token: str, emails: str, store: Store
) -> None:
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    at = [hour + timedelta(minutes=m) for m in (65, 70, 100 * 60)]  # the next hour twice, then later
    events = [NewEvent(item_key=f"k{n}", data={}, schedule_on=a) for n, a in enumerate(at)]
    store.events.schedule_batch(store.queues.get(emails), events, actor="t")
    found = client.get("/v1/queues/emails/forecast?hours=2&bucket=hour", headers=auth(token)).json
    assert found == {
        "buckets": [
            {"from": hour.strftime("%Y-%m-%dT%H:%M:%SZ"), "count": 0},
            {"from": (hour + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"), "count": 2},
        ],
        "later": 1,
        "exact": True,
    }
    default = client.get("/v1/queues/emails/forecast", headers=auth(token)).json
    assert len(default["buckets"]) == 24
    for query, field in [("hours=0", "hours"), ("hours=169", "hours"), ("bucket=day", "bucket"), ("hours=x", "hours")]:
        response = client.get(f"/v1/queues/emails/forecast?{query}", headers=auth(token))
        assert response.status_code == 400, query
        assert response.content_type == "application/problem+json"
        assert field in json.dumps(response.json)
    assert client.get("/v1/queues/nope/forecast", headers=auth(token)).status_code == 404


def test_concurrent_writers_and_folds_keep_the_forecast_exact(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    import threading

    queue = make_queue("jobs")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            barrier.wait()
            for batch in range(5):
                at = [NOW + timedelta(minutes=(n * 37 + batch * 11 + i * 7) % 3000) for i in range(50)]
                events = [NewEvent(item_key=f"w{n}-{batch}-{i}", data={}, schedule_on=a) for i, a in enumerate(at)]
                store.events.schedule_batch(queue, events, actor="t")
                moved = NOW + timedelta(minutes=(n * 13 + batch) % 2000)
                store.events.change("jobs", f"w{n}-{batch}-0", EventChanges(schedule_on=moved), actor="t")
                store.events.cancel("jobs", f"w{n}-{batch}-1", actor="t")
        except BaseException as error:  # reported below
            errors.append(error)

    writing = True

    def fold() -> None:  # the dispatcher's upkeep, meanwhile
        try:
            while writing:
                store.forecasts.fold()
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    folder = threading.Thread(target=fold)
    for thread in [*threads, folder]:
        thread.start()
    for thread in threads:
        thread.join()
    writing = False
    folder.join()
    assert errors == []
    for bucket in ("minute", "hour"):
        found = store.forecasts.forecast("jobs", hours=24, bucket=bucket, now=NOW)
        assert found == brute_force(raw, "jobs", found, bucket, NOW)
        assert sum(found.counts) + found.later == 4 * 5 * 49


def test_an_upgraded_database_counts_the_events_it_already_has(admin_url: str) -> None:
    from tests import pg
    from tickler.scheduler.db import libpq_url
    from tickler.scheduler.migrate import migrate

    url = pg.create_database(admin_url, prefix="tickler_forecast_upgrade")
    try:
        migrate(url, through=75)  # the numbered steps before the forecast's, and events written then
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts,"
                " backoff_initial_seconds, backoff_max_seconds, backoff_multiplier)"
                " VALUES ('jobs', 'pull', 30, 10, 1, 60, 2)"
            )
            conn.execute(
                "INSERT INTO tickler_event (queue, item_key, schedule_on, enqueued_by, max_attempts)"
                " SELECT 'jobs', 'k' || n, now() + make_interval(mins => n * 7), 't', 10 FROM generate_series(1, 500) n"
            )
        migrate(url)
        from tickler.scheduler.db import create_engine

        engine = create_engine(url, pool_size=1)
        try:
            now = datetime.now(UTC)
            found = Store(engine).forecasts.forecast("jobs", hours=24, bucket="hour", now=now)
            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                assert found == brute_force(conn, "jobs", found, "hour", now)
            assert found.exact and sum(found.counts) + found.later == 500
        finally:
            engine.dispose()
    finally:
        pg.drop_database(admin_url, url)
