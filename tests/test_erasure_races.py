"""Erasures under way while tickler works (SPEC §12): racing a dispatcher that delivers the
subject's events, clients that reschedule and retry them, and a kill -9 of the process erasing.
Whatever the interleaving, an erasure is never half-applied to a row, and once it is done no
event of the subject is open, delivered afterwards, or readable by its key."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import requests
import sqlalchemy as sa
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers_wait import wait_until
from tickler.scheduler.delivery import Delivered, Outcome
from tickler.scheduler.dispatcher import Dispatcher, DispatcherConfig
from tickler.scheduler.erasing import Eraser, Hasher
from tickler.scheduler.models import Lease, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.wakeup import WakeupListener

ROOT = Path(__file__).resolve().parents[1]
BUSY_ERASING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE state <> 'idle' AND query LIKE '%tickler_erase%' AND pid <> pg_backend_pid()"
)
MARK = "zqxrace"
GROUP = f"{MARK}@example.com"


def schedule_many(client: FlaskClient, token: str, prefix: str, n: int, **fields: Any) -> None:
    data = {"who": GROUP} if MARK in prefix else {"who": "bob"}
    events = [{"item_key": f"{prefix}{i}", "data": data, **fields} for i in range(n)]
    response = client.post("/v1/queues/emails/events/batch", json={"events": events}, headers=auth(token))
    assert response.status_code == 200, response.json


def status(client: FlaskClient, admin_token: str, erasure_id: int) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/erasures/{erasure_id}", headers=auth(admin_token)).json
    return body


def plain_rows(raw: psycopg.Connection[Any]) -> list[Any]:
    """Rows anywhere that still hold the subject's values."""
    return raw.execute(
        "SELECT 'event', item_key FROM tickler_event_all WHERE item_key LIKE %(m)s OR group_key LIKE %(m)s"
        " OR data::text LIKE %(m)s OR last_error LIKE %(m)s"
        " UNION ALL SELECT 'entry', item_key FROM tickler_timeline"
        " WHERE item_key LIKE %(m)s OR details::text LIKE %(m)s",
        {"m": f"%{MARK}%"},
    ).fetchall()


def half_erased(raw: psycopg.Connection[Any]) -> list[Any]:
    """Rows whose key is hashed but that kept a value, or the other way round."""
    return raw.execute(
        "SELECT id, item_key, data FROM tickler_event_all"
        " WHERE (item_key LIKE 'erased:%%') <> (data = '{}' AND coalesce(group_key, 'erased:') LIKE 'erased:%%')"
    ).fetchall()


class Recording:
    """A deliverer that records when each delivery of the subject's events started."""

    def __init__(self) -> None:
        self.started: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def deliver(self, queue: Queue, lease: Lease) -> Outcome:
        with self.lock:
            self.started.extend((time.monotonic(), event.item_key) for event in lease.events)
        return Delivered()


def test_an_erasure_racing_the_dispatcher_leaves_nothing_to_deliver(
    client: FlaskClient,
    emails: str,
    token: str,
    admin_token: str,
    store: Store,
    database_url: str,
    raw: psycopg.Connection[Any],
) -> None:
    schedule_many(client, token, f"due:{MARK}:", 300, group_key=GROUP)
    schedule_many(client, token, f"solo:{MARK}:", 300)
    schedule_many(client, token, "bystander:", 50)
    recording = Recording()
    config = DispatcherConfig(worker_name="racer", concurrency=4, poll_interval=0.2)
    dispatcher = Dispatcher(store, WakeupListener(database_url), config, deliverers={"emails": recording})
    dispatcher.eraser.batch_rows = 25  # many small batches, interleaved with claims
    erasure = client.post(
        "/v1/erasures",
        json={"group_key": GROUP, "item_key_prefix": f"solo:{MARK}", "reason": "race"},
        headers=auth(admin_token),
    ).json
    dispatcher.start()
    try:
        wait_until(lambda: status(client, admin_token, erasure["id"])["status"] == "done", timeout=60)
        done_seen = time.monotonic()
        wait_until(lambda: raw.execute("SELECT count(*) FROM tickler_event").fetchone() == (0,), timeout=30)
    finally:
        dispatcher.stop()
    late = [key for at, key in recording.started if at > done_seen and MARK in key]
    assert late == []
    assert plain_rows(raw) == [] and half_erased(raw) == []
    done = status(client, admin_token, erasure["id"])
    with recording.lock:
        delivered_subject = len({key for _, key in recording.started if MARK in key})
    # every subject event was either delivered before the erasure reached it, or cancelled by it
    assert done["counts"]["open_events"] + done["counts"]["finished_events"] >= 600 - delivered_subject
    outcomes = dict(raw.execute("SELECT outcome, count(*) FROM tickler_event_history GROUP BY 1").fetchall())
    assert outcomes.get("cancelled", 0) == done["counts"]["open_events"]
    assert sum(outcomes.values()) == 650


def test_an_erasure_racing_reschedules_and_retries_erases_whatever_they_did(
    live_server: str,
    client: FlaskClient,
    emails: str,
    token: str,
    admin_token: str,
    engine: sa.Engine,
    raw: psycopg.Connection[Any],
) -> None:
    schedule_many(client, token, f"later:{MARK}:", 200, delay_seconds=3600)
    # dead events to retry: one attempt each, failed
    schedule_many(client, token, f"dead:{MARK}:", 50, max_attempts=1)
    claimed = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 50}, headers=auth(token)).json
    for lease in claimed["leases"]:
        nack = client.post(f"/v1/leases/{lease['lease_id']}/nack", json={"error": f"no {GROUP}"}, headers=auth(token))
        assert nack.status_code == 200
    erasure = client.post(
        "/v1/erasures", json={"item_key_prefix": f"later:{MARK}", "reason": "race"}, headers=auth(admin_token)
    ).json
    dead_erasure = client.post(
        "/v1/erasures", json={"item_key_prefix": f"dead:{MARK}", "reason": "race"}, headers=auth(admin_token)
    ).json
    stop = threading.Event()
    answers: list[int] = []

    def churn(kind: str) -> None:
        with requests.Session() as session:
            session.headers.update(auth(token))
            n = 0
            while not stop.is_set():
                if kind == "reschedule":
                    url = f"{live_server}/v1/queues/emails/events/later:{MARK}:{n % 200}"
                    answers.append(session.patch(url, json={"delay_seconds": 60 + n}, timeout=30).status_code)
                else:
                    url = f"{live_server}/v1/queues/emails/events/dead:{MARK}:{n % 50}/retry"
                    answers.append(session.post(url, json={"delay_seconds": 3600}, timeout=30).status_code)
                n += 1

    threads = [threading.Thread(target=churn, args=(kind,)) for kind in ("reschedule", "retry")]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(answers) > 20)  # the churn is under way
        eraser = Eraser(engine, Hasher(engine), batch_rows=10)
        wait_until(lambda: eraser.run(erasure["id"]) and eraser.run(dead_erasure["id"]), timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert set(answers) <= {200, 404, 409}, set(answers)
    assert plain_rows(raw) == [] and half_erased(raw) == []
    for erasure_id in (erasure["id"], dead_erasure["id"]):
        assert status(client, admin_token, erasure_id)["status"] == "done"
    assert client.get(f"/v1/queues/emails/events/later:{MARK}:1", headers=auth(token)).status_code == 404
    assert client.post(f"/v1/queues/emails/events/dead:{MARK}:1/retry", headers=auth(token)).status_code == 404


def test_a_killed_erasure_resumes_to_done_without_half_erased_rows(
    client: FlaskClient,
    emails: str,
    token: str,
    admin_token: str,
    engine: sa.Engine,
    database_url: str,
    raw: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    schedule_many(client, token, f"k:{MARK}:", 3000, delay_seconds=3600)
    erasure = client.post(
        "/v1/erasures", json={"item_key_prefix": f"k:{MARK}", "reason": "crash"}, headers=auth(admin_token)
    ).json
    with open(tmp_path / "eraser.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.workers.erasing", database_url, str(erasure["id"]), "20"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: status(client, admin_token, erasure["id"])["counts"]["open_events"] >= 200, timeout=60)
    finally:
        process.kill()  # SIGKILL: no clean-up of any kind
        process.wait(timeout=10)
    # the statement its server process was running when it died commits or rolls back whole
    wait_until(lambda: raw.execute(BUSY_ERASING).fetchone() == (0,), what="the killed runner's last statement")
    stopped = status(client, admin_token, erasure["id"])
    assert stopped["status"] == "running" and stopped["finished_at"] is None
    assert 200 <= stopped["counts"]["open_events"] < 3000, stopped
    assert half_erased(raw) == []
    # exactly the counted events are erased: batches commit whole, with their counts
    [[erased]] = raw.execute("SELECT count(*) FROM tickler_event_all WHERE item_key LIKE 'erased:%'").fetchall()
    assert erased == stopped["counts"]["open_events"]

    assert Eraser(engine, Hasher(engine)).run_unfinished() == [erasure["id"]]
    done = status(client, admin_token, erasure["id"])
    assert done["status"] == "done" and done["counts"]["open_events"] == 3000
    assert plain_rows(raw) == [] and half_erased(raw) == []
    # resumed again (a second runner that started late): nothing more happens
    assert Eraser(engine, Hasher(engine)).run(erasure["id"])
    assert status(client, admin_token, erasure["id"]) == done
