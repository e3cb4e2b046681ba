"""Replicated PostgreSQL (SPEC §13) with real servers: a primary and a synchronous streaming
standby (Debian's PostgreSQL 15, loopback TCP), tickler's API (a real HTTP server) and a
dispatcher over the URL that lists both with target_session_attrs=read-write.

kill -9 of the primary while clients schedule and events are delivered, then promotion of the
standby: nothing answered 2xx is lost, writes answer 503 with Retry-After (never 500) meanwhile,
the same processes go on without a restart, and a lease taken before is finished once or
redelivered with its redelivery counted. A replica whose replay is paused sends the reads that
may lag (the API's and the pipeline's) back to the primary. The times measured are printed (`-s`) for docs/deploy.md.
"""

from __future__ import annotations

import platform
import time

import httpx
import pytest

from tests import helpers_failover as failover
from tests import pg_cluster
from tests.helpers_failover import Pair
from tests.helpers_http import serving_app
from tests.helpers_wait import wait_until
from tickler.api import close_app, create_app
from tickler.commands.database import open_reader
from tickler.config import Settings
from tickler.pipeline import db as pipeline_db
from tickler.pipeline.replica import primary_lsn, read_url
from tickler.scheduler.db import create_engine
from tickler.scheduler.models import Event
from tickler.scheduler.replica import ReadEngines
from tickler.scheduler.store import SearchFilter, Store
from tickler.scheduler.store.dashboard import DashboardStore
from tickler.scheduler.store.ui_reads import UIReads
from tickler.scheduler.worker import Worker

pytestmark = [
    pytest.mark.replica,
    pytest.mark.skipif(not pg_cluster.available(), reason="needs PostgreSQL 15's binaries"),
]


pair = failover.pair  # the fixture


def test_failover_to_a_synchronous_standby_loses_nothing_and_the_processes_reconnect(pair: Pair) -> None:
    url = pair.url()
    settings = Settings(database_url=url, migrate_on_start=False, pool_size=8)
    setup_engine = create_engine(url, pool_size=1)
    token = failover.admin(Store(setup_engine))
    setup_engine.dispose()

    delivered = failover.Delivered()
    worker = Worker(settings=settings, name="failover", poll_interval=0.5, reap_interval=0.2)

    @worker.handler("jobs")
    def deliver(event: Event) -> None:
        delivered.add(event.item_key, event.redeliver_count)

    app = create_app(settings, configure_logs=False)
    worker.start()
    answers = failover.Answers()
    try:
        with (
            serving_app(app) as base,
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http,
        ):
            # a lease taken before the failover
            assert http.post("/v1/queues/pulls/events", json={"item_key": "held", "data": {}}).status_code == 202
            [lease] = http.post("/v1/queues/pulls/claims", json={"worker": "w1", "limit": 1}).json()["leases"]

            with failover.scheduling(base, token, answers) as stop:
                wait_until(
                    lambda: len(answers.accepted()) >= 100 and len(delivered.snapshot()) >= 20, what="traffic before"
                )
                killed, promoted = failover.fail_over(pair, answers)
                wait_until(lambda: answers.accepted(after=promoted), timeout=30, what="a 2xx after promotion")
                first_accepted = min(at for _, s, _, at in answers.snapshot() if 200 <= s < 300 and at >= promoted)
                wait_until(lambda: delivered.after(promoted), timeout=30, what="a delivery after promotion")
                first_delivery = min(at for _, _, at in delivered.snapshot() if at > promoted)
                after = len(answers.accepted(after=promoted))
                wait_until(lambda: len(answers.accepted(after=promoted)) >= after + 100, what="traffic after")
                stop()

            # The lease of before: acked once, or redelivered with its redelivery counted.
            acked = http.post(f"/v1/leases/{lease['lease_id']}/ack")
            if acked.status_code != 200:
                assert acked.status_code == 409, acked.text
                again = wait_until(
                    lambda: http.post("/v1/queues/pulls/claims", json={"worker": "w2", "limit": 1}).json()["leases"],
                    what="the held event claimed again",
                )
                [[event]] = [lease_again["events"] for lease_again in again]
                assert event["item_key"] == "held" and event["redeliver_count"] >= 1
                assert http.post(f"/v1/leases/{again[0]['lease_id']}/ack").status_code == 200
            held = http.get("/v1/queues/pulls/events/held").json()
            assert held["status"] == "delivered"
            timeline = http.get("/v1/queues/pulls/events/held/timeline").json()["entries"]
            assert [e["action"] for e in timeline].count("delivered") == 1

            # every event answered 2xx, before or after the failover, is there and is delivered
            accepted = failover.check_answers(answers)
            duplicates = failover.check_delivered(url, "jobs", accepted, delivered)
            all_delivered = time.monotonic()
            refused = answers.refused_after(0.0)
    finally:
        worker.stop()
        close_app(app)

    failover.report(
        "failover",
        {
            "machine": f"{platform.machine()}, {failover.cpus()} cores, loopback, PostgreSQL 15, fsync off",
            "events_answered_2xx": len(accepted),
            "events_lost": 0,
            "answered_503_while_no_primary": refused,
            "delivered_twice": len(duplicates),
            "kill_to_promotion_seconds": round(promoted - killed, 3),
            "promotion_to_first_2xx_seconds": round(first_accepted - promoted, 3),
            "promotion_to_first_delivery_seconds": round(first_delivery - promoted, 3),
            "promotion_to_every_accepted_event_delivered_seconds": round(all_delivered - promoted, 3),
            "lease_before_failover": "acked once" if acked.status_code == 200 else "redelivered, counted",
        },
    )


def test_a_lagging_replica_sends_the_reads_to_the_primary(pair: Pair) -> None:
    url = pair.url()
    replica_url = pair.standby.url("tickler")
    settings = Settings(
        database_url=url, read_database_url=replica_url, read_max_lag_seconds=1.0, migrate_on_start=False, pool_size=4
    )
    setup_engine = create_engine(url, pool_size=1)
    token = failover.admin(Store(setup_engine))
    setup_engine.dispose()
    app = create_app(settings, configure_logs=False)
    reads = app.extensions["tickler"].store.reads
    try:
        with (
            serving_app(app) as base,
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http,
        ):

            def found(key: str) -> bool:
                response = http.get("/v1/queues/jobs/events", params={"item_key_prefix": key})
                assert response.status_code == 200, response.text
                return any(e["item_key"] == key for e in response.json()["events"])

            def gauges() -> dict[str, float]:
                text = http.get("/metrics").text
                return {
                    line.split()[0]: float(line.split()[1])
                    for line in text.splitlines()
                    if line.startswith("tickler_read_replica_")
                }

            def on_replica() -> bool:
                return reads.engine() is reads.replica  # measures again when the last measure is a second old

            def command_reads_on() -> int:
                """The port `tickler queues list`'s plain connection reads from."""
                with open_reader(settings, may_lag=True) as conn:
                    return int(conn.info.port)

            assert http.post("/v1/queues/jobs/events", json={"item_key": "first", "data": {}}).status_code == 202
            wait_until(lambda: found("first"), what="the first event found")
            wait_until(on_replica, what="reads on the replica")
            assert gauges()["tickler_read_replica_in_use"] == 1
            assert gauges()["tickler_read_replica_lag_seconds"] <= 1.0
            assert command_reads_on() == pair.standby.port

            _every_lagging_read_runs_on(replica_url, "first")

            # the pipeline's reads: on the replica while it is close enough
            assert read_url(url, replica_url, max_lag_seconds=1.0) == replica_url

            pair.standby.execute("SELECT pg_wal_replay_pause()")
            paused = time.monotonic()
            assert http.post("/v1/queues/jobs/events", json={"item_key": "second", "data": {}}).status_code == 202
            with pipeline_db.connect(url) as primary:
                written = primary_lsn(primary)
            # an archive run's rows are read where its selection has arrived: not on this replica
            assert read_url(url, replica_url, max_lag_seconds=1.0, after_lsn=written) == url
            # the replica does not have it, and will not until replay resumes ...
            assert pair.standby.execute("SELECT count(*) FROM tickler_event WHERE item_key = 'second'", "tickler") == [
                (0,)
            ]
            # ... yet the search finds it within the lag allowed (and a check's second): on the primary
            wait_until(lambda: found("second"), timeout=10, what="the second event found on the primary")
            moved = time.monotonic() - paused
            assert not on_replica()
            metrics = gauges()
            assert metrics["tickler_read_replica_in_use"] == 0
            assert metrics["tickler_read_replica_lag_seconds"] > 1.0
            assert command_reads_on() == pair.primary.port
            # the timeline and the queue's counts answer from the primary too
            assert http.get("/v1/queues/jobs/events/second/timeline").status_code == 200
            assert http.get("/v1/queues/jobs").json()["counts"]["pending"] >= 2

            pair.standby.execute("SELECT pg_wal_replay_resume()")
            wait_until(on_replica, timeout=10, what="reads back on the replica")
            assert found("second")
            assert read_url(url, replica_url, max_lag_seconds=1.0, after_lsn=written) == replica_url

            # a replica that is gone: the reads go on, on the primary
            pair.standby.kill()
            wait_until(lambda: not on_replica() and found("second"), timeout=10, what="reads off a dead replica")
            assert gauges()["tickler_read_replica_in_use"] == 0
            assert read_url(url, replica_url, max_lag_seconds=1.0) == url
            assert command_reads_on() == pair.primary.port
    finally:
        close_app(app)
    failover.report("lagging_replica", {"replay_paused_to_reads_on_primary_seconds": round(moved, 3)})


def test_failing_back_to_the_old_primary_rebuilt_as_a_standby(pair: Pair) -> None:
    """kill -9 of the primary, promotion of the standby, the old primary rewound (pg_rewind) into a
    standby of the new one, then a second failover back to it: the same API process serves on,
    and every event answered 2xx across both failovers is there at the end."""
    url = pair.url()
    setup_engine = create_engine(url, pool_size=1)
    token = failover.admin(Store(setup_engine))
    setup_engine.dispose()
    app = create_app(Settings(database_url=url, migrate_on_start=False, pool_size=4), configure_logs=False)
    accepted: list[str] = []
    try:
        with (
            serving_app(app) as base,
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http,
        ):

            def schedule(prefix: str, count: int) -> None:
                for n in range(count):
                    key = f"{prefix}-{n}"
                    response = wait_until(
                        lambda key=key: _accepted_or_none(http, key),  # type: ignore[misc]
                        timeout=30,
                        what=f"{key} accepted",
                    )
                    assert response in (202, 503)
                    accepted.append(key)

            schedule("on-a", 20)
            pair.primary.kill()
            pair.standby.promote()
            schedule("on-b", 20)

            # the old primary, rewound to the new one's timeline, follows it (asynchronously: the new
            # primary was not told to wait for it, so its writes went on while it was away)
            pair.primary.rewind_to(pair.standby)
            pair.primary.start()
            schedule("on-b-with-a-following", 20)
            [(lsn,)] = pair.standby.execute("SELECT CAST(pg_current_wal_lsn() AS text)")
            wait_until(
                lambda: pair.primary.execute(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'")[0][0],
                what=lambda: "the rebuilt node caught up: " + pair.primary.log_tail(),
            )
            pair.standby.kill()
            pair.primary.promote()
            schedule("on-a-again", 20)
            found = http.get("/v1/queues/jobs/events", params={"limit": 1000}).json()["events"]
    finally:
        close_app(app)
    assert sorted(e["item_key"] for e in found) == sorted(accepted)
    assert pair.primary.execute("SELECT pg_is_in_recovery()") == [(False,)]


def _accepted_or_none(http: httpx.Client, key: str) -> int | None:
    """202 once the API accepts the event; None (try again) while it answers 503."""
    response = http.post("/v1/queues/jobs/events", json={"item_key": key, "data": {}})
    assert response.status_code in (202, 503), response.text
    if response.status_code == 503:
        assert response.headers.get("Retry-After")
        return None
    return response.status_code


def _every_lagging_read_runs_on(standby_url: str, key: str) -> None:
    """Each read that may lag runs on a hot standby as it is (none writes, locks or needs the
    primary): run on a store whose every engine is the standby's, none may fail."""
    engine = create_engine(standby_url, pool_size=1)
    try:
        reads = ReadEngines(engine)
        store = Store(engine, reads)
        assert [e.item_key for e in store.events.search("jobs", SearchFilter())] == [key]
        assert [e.action for e in store.events.timeline("jobs", key)] == ["enqueued"]
        assert store.queues.counts("jobs")["pending"] == 1
        assert {g.name: g.pending for g in store.queues.gauges()}["jobs"] == 1
        dashboard, ui = DashboardStore(engine, reads), UIReads(engine, reads)
        assert {q.name for q in dashboard.overview(None)} == {"jobs", "pulls"}
        assert dashboard.live_leases(None) == []
        assert ui.timeline_page("jobs", key, before=None, limit=10).entries
        assert ui.count("jobs", SearchFilter(), cap=10).n == 1
        assert ui.fair_backlogs("jobs").seen == 1
    finally:
        engine.dispose()
