"""Operations API (SPEC §7): retry dead events by key and by filter, pause and resume, delete a queue."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import requests
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, schedule, written
from tests.helpers_wait import wait_until
from tickler.scheduler.db import libpq_url
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import Event
from tickler.scheduler.sql import driver_sql, run
from tickler.scheduler.store import Store


def claim_all(client: FlaskClient, token: str, queue: str = "emails") -> list[dict[str, Any]]:
    response = client.post(f"/v1/queues/{queue}/claims", json={"worker": "w", "limit": 100}, headers=auth(token))
    assert response.status_code == 200, response.json
    leases: list[dict[str, Any]] = response.json["leases"]
    return leases


def fail_once(client: FlaskClient, token: str, item_key: str, queue: str = "emails") -> dict[str, Any]:
    """Claim the key's event (due now) and nack it, retrying at once; returns the event after."""
    [lease] = [lease for lease in claim_all(client, token, queue) if lease["events"][0]["item_key"] == item_key]
    nack = client.post(
        f"/v1/leases/{lease['lease_id']}/nack", json={"error": "boom", "retry_in_seconds": 0}, headers=auth(token)
    )
    assert nack.status_code == 200, nack.json
    got: dict[str, Any] = client.get(key_url(item_key, queue), headers=auth(token)).json
    return got


def make_dead(client: FlaskClient, token: str, item_key: str, queue: str = "emails", **fields: Any) -> dict[str, Any]:
    """Schedule `item_key` with one attempt and fail it: a dead event."""
    assert schedule(client, token, item_key, queue, max_attempts=1, **fields).status_code == 202
    dead = fail_once(client, token, item_key, queue)
    assert dead["status"] == "dead", dead
    return dead


def retry(client: FlaskClient, token: str, item_key: str, body: Any = None, queue: str = "emails") -> Any:
    return client.post(key_url(item_key, queue, "/retry"), json=body, headers=auth(token))


def test_retry_reopens_the_dead_event_with_a_fresh_budget(client: FlaskClient, emails: str, token: str) -> None:
    assert schedule(client, token, "k", max_attempts=2).status_code == 202
    assert fail_once(client, token, "k")["status"] == "pending"
    dead = fail_once(client, token, "k")
    assert dead["status"] == "dead"
    counts = client.get("/v1/queues/emails", headers=auth(token)).json["counts"]
    assert counts["dead"] == 1

    response = retry(client, token, "k")
    assert response.status_code == 200, response.json
    event = response.json
    assert event["id"] == dead["id"]  # the same event, open again
    assert event["status"] == "pending" and event["dequeued_on"] is None and event["dequeued_by"] is None
    assert event["version"] > dead["version"] and response.headers["ETag"] == f'"{event["version"]}"'
    assert event["redeliver_count"] == dead["redeliver_count"]  # the count never goes back
    assert event["max_attempts"] == dead["redeliver_count"] + 2  # two attempts, counted from now
    counts = client.get("/v1/queues/emails", headers=auth(token)).json["counts"]
    assert (counts["dead"], counts["pending"], counts["due"]) == (0, 1, 1)
    last = client.get(key_url("k", suffix="/timeline"), headers=auth(token)).json["entries"][-1]
    assert (last["action"], last["actor"], last["event_id"]) == ("retried", "signup-service", dead["id"])
    assert last["details"]["attempts"] == 2

    # exactly the budget again: one failure leaves it pending, the second is its last
    assert fail_once(client, token, "k")["status"] == "pending"
    again = fail_once(client, token, "k")
    assert again["status"] == "dead"
    # a second retry gives the same budget, not a growing one
    second = retry(client, token, "k").json
    assert second["max_attempts"] == again["redeliver_count"] + 2


def test_retry_at_a_time_or_after_a_delay(client: FlaskClient, emails: str, token: str) -> None:
    make_dead(client, token, "at")
    response = retry(client, token, "at", {"schedule_on": "2099-01-02T03:04:05+01:00"})
    assert response.status_code == 200, response.json
    assert response.json["schedule_on"] == "2099-01-02T02:04:05Z"
    make_dead(client, token, "later")
    later = retry(client, token, "later", {"delay_seconds": 3600}).json
    counts = client.get("/v1/queues/emails", headers=auth(token)).json["counts"]
    assert later["status"] == "pending" and counts["due"] == 0 and counts["pending"] == 2


def test_retry_refusals(
    client: FlaskClient, emails: str, token: str, admin_token: str, raw: psycopg.Connection
) -> None:
    assert_problem(retry(client, token, "never-seen"), 404)
    assert schedule(client, token, "open").status_code == 202
    conflict = assert_problem(retry(client, token, "open"), 409)
    assert conflict["event"]["item_key"] == "open"  # the open event, as for a key conflict
    # the most recent event was delivered: nothing dead to retry
    [lease] = claim_all(client, token)
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(token)).status_code == 200
    assert_problem(retry(client, token, "open"), 404)
    # an older dead event of a key whose newer event was delivered is not retried either
    make_dead(client, token, "old")
    assert schedule(client, token, "old").status_code == 202
    [lease] = claim_all(client, token)
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(token)).status_code == 200
    assert_problem(retry(client, token, "old"), 404)
    # another tenant's queue is a 404
    assert client.put("/v1/queues/billing", json={}, headers=auth(admin_token)).status_code == 201
    make_dead(client, admin_token, "theirs", queue="billing")
    assert_problem(retry(client, token, "theirs", queue="billing"), 404)

    make_dead(client, token, "bad-input")
    before = written(raw)
    assert_problem(
        retry(client, token, "bad-input", {"schedule_on": "2099-01-01T00:00:00Z", "delay_seconds": 1}),
        400,
        "schedule_on",
        "delay_seconds",
    )
    assert_problem(retry(client, token, "bad-input", {"schedule_on": "tomorrow"}), 400, "schedule_on")
    assert_problem(retry(client, token, "bad-input", {"delay_seconds": -1}), 400, "delay_seconds")
    assert_problem(retry(client, token, "bad-input", {"attempts": 3}), 400, "attempts")
    assert_problem(retry(client, token, "bad-input", [1]), 400)
    assert written(raw) == before
    assert client.get(key_url("bad-input"), headers=auth(token)).json["status"] == "dead"


def test_retry_matching_by_prefix_and_group(client: FlaskClient, emails: str, token: str) -> None:
    make_dead(client, token, "welcome:ana", group_key="ana")
    make_dead(client, token, "welcome:bob", group_key="bob")
    make_dead(client, token, "reminder:ana", group_key="ana")
    make_dead(client, token, "welcomeX")  # no ":": not under the prefix
    # a dead key that was scheduled again and delivered: its newest event is not dead
    make_dead(client, token, "welcome:cy")
    assert schedule(client, token, "welcome:cy").status_code == 202
    [lease] = claim_all(client, token)
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(token)).status_code == 200

    url = "/v1/queues/emails/events/retry"
    response = client.post(url, json={"item_key_prefix": "welcome:"}, headers=auth(token))
    assert response.status_code == 200, response.json
    assert response.json == {"retried": 2}
    statuses = {
        key: client.get(key_url(key), headers=auth(token)).json["status"]
        for key in ("welcome:ana", "welcome:bob", "reminder:ana", "welcomeX", "welcome:cy")
    }
    assert statuses == {
        "welcome:ana": "pending",
        "welcome:bob": "pending",
        "reminder:ana": "dead",
        "welcomeX": "dead",
        "welcome:cy": "delivered",
    }
    entry = client.get(key_url("welcome:ana", suffix="/timeline"), headers=auth(token)).json["entries"][-1]
    assert (entry["action"], entry["actor"], entry["details"]["bulk"]) == ("retried", "signup-service", True)
    # by group: only reminder:ana is still dead in group ana; both filters combine
    assert client.post(url, json={"group_key": "ana"}, headers=auth(token)).json == {"retried": 1}
    assert client.post(url, json={"group_key": "ana", "item_key_prefix": "x"}, headers=auth(token)).json == {
        "retried": 0
    }


def test_retry_matching_needs_a_filter(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection) -> None:
    make_dead(client, token, "k")
    before = written(raw)
    url = "/v1/queues/emails/events/retry"
    assert_problem(client.post(url, json={}, headers=auth(token)), 400, "body")
    assert_problem(client.post(url, json={"group_key": 3}, headers=auth(token)), 400, "group_key")
    assert_problem(client.post(url, json={"item_key_prefix": "a/b"}, headers=auth(token)), 400, "item_key_prefix")
    assert_problem(client.post(url, json={"status": "dead", "group_key": "g"}, headers=auth(token)), 400, "status")
    assert written(raw) == before


def test_racing_retries_of_one_key_over_http(
    client: FlaskClient, emails: str, token: str, live_server: str, raw: psycopg.Connection
) -> None:
    make_dead(client, token, "race:1")
    threads_count = 8
    barrier = threading.Barrier(threads_count)
    statuses: list[int] = []
    lock = threading.Lock()

    def attempt() -> None:
        with requests.Session() as session:
            barrier.wait(timeout=30)
            url = f"{live_server}{key_url('race:1', suffix='/retry')}"
            response = session.post(url, headers=auth(token), timeout=30)
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=attempt) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(statuses) == [200] + [409] * (threads_count - 1)
    retried = raw.execute(
        "SELECT count(*) FROM tickler_timeline WHERE item_key = 'race:1' AND action = 'retried'"
    ).fetchone()
    assert retried == (1,)


def test_pause_and_resume(client: FlaskClient, emails: str, token: str, admin_token: str) -> None:
    assert client.get("/v1/queues/emails", headers=auth(token)).json["paused"] is False
    assert_problem(client.post("/v1/queues/emails/pause", headers=auth(token)), 403)
    assert_problem(client.post("/v1/queues/nope/pause", headers=auth(admin_token)), 404)
    assert_problem(client.post("/v1/queues/No!/pause", headers=auth(admin_token)), 404)

    paused = client.post("/v1/queues/emails/pause", headers=auth(admin_token))
    assert paused.status_code == 200, paused.json
    assert paused.json["paused"] is True and paused.json["name"] == "emails" and "counts" in paused.json
    assert client.post("/v1/queues/emails/pause", headers=auth(admin_token)).json["paused"] is True  # idempotent
    assert client.get("/v1/queues/emails", headers=auth(token)).json["paused"] is True
    assert [q["paused"] for q in client.get("/v1/queues", headers=auth(token)).json["queues"]] == [True]
    # scheduling, moving and cancelling go on
    assert schedule(client, token, "k").status_code == 202
    assert client.patch(key_url("k"), json={"delay_seconds": 5}, headers=auth(token)).status_code == 200
    assert client.delete(key_url("k"), headers=auth(token)).status_code == 200

    resumed = client.post("/v1/queues/emails/resume", headers=auth(admin_token))
    assert resumed.status_code == 200 and resumed.json["paused"] is False
    assert client.get("/v1/queues/emails", headers=auth(token)).json["paused"] is False


def test_delete_queue(client: FlaskClient, emails: str, token: str, admin_token: str, raw: psycopg.Connection) -> None:
    assert schedule(client, token, "done").status_code == 202
    [first] = claim_all(client, token)
    assert client.post(f"/v1/leases/{first['lease_id']}/ack", headers=auth(token)).status_code == 200
    assert rows_of(raw, "tickler_minute_stat WHERE queue = 'emails'") > 0
    assert schedule(client, token, "open:1").status_code == 202
    assert schedule(client, token, "open:2", delay_seconds=600).status_code == 202
    claim_all(client, token)  # open:1 is in flight: a delete cancels it all the same

    assert_problem(client.delete("/v1/queues/emails", headers=auth(token)), 403)
    assert_problem(client.delete("/v1/queues/missing", headers=auth(admin_token)), 404)
    before = written(raw)
    assert_problem(client.delete("/v1/queues/emails?cancel_open=yes", headers=auth(admin_token)), 400, "cancel_open")
    assert_problem(client.delete("/v1/queues/emails?force=true", headers=auth(admin_token)), 400, "force")
    refused = assert_problem(client.delete("/v1/queues/emails", headers=auth(admin_token)), 409)
    assert "open events" in refused["detail"]
    assert written(raw) == before

    deleted = client.delete("/v1/queues/emails?cancel_open=true", headers=auth(admin_token))
    assert deleted.status_code == 200, deleted.json
    assert deleted.json == {"name": "emails", "cancelled": 2, "deleted_events": 3}
    assert_problem(client.get("/v1/queues/emails", headers=auth(admin_token)), 404)
    assert_problem(schedule(client, token, "after"), 404)
    assert [q["name"] for q in client.get("/v1/queues", headers=auth(admin_token)).json["queues"]] == []
    # the history of its keys stays readable to admins, and only to them
    timeline = client.get(key_url("open:2", suffix="/timeline"), headers=auth(admin_token))
    assert timeline.status_code == 200, timeline.json
    last = timeline.json["entries"][-1]
    assert (last["action"], last["actor"], last["details"]) == ("cancelled", "ops", {"reason": "queue deleted"})
    assert_problem(client.get(key_url("open:2", suffix="/timeline"), headers=auth(token)), 404)
    # a delivery's entry, which was its history row (migration 0072), stays with the others
    delivered = client.get(key_url("done", suffix="/timeline"), headers=auth(admin_token)).json["entries"]
    assert [e["action"] for e in delivered] == ["enqueued", "claimed", "delivered"]
    assert rows_of(raw, "tickler_event_history WHERE queue = 'emails'") == 0
    assert rows_of(raw, "tickler_queue_count WHERE queue = 'emails'") == 0
    assert rows_of(raw, "tickler_minute_stat WHERE queue = 'emails'") == 0  # the charts start empty

    # the name is free again: a new, empty queue
    assert client.put("/v1/queues/emails", json={}, headers=auth(admin_token)).status_code == 201
    counts = client.get("/v1/queues/emails", headers=auth(token)).json["counts"]
    assert set(counts.values()) == {0}
    assert schedule(client, token, "open:2").status_code == 202


def test_delete_queue_takes_its_schedules(client: FlaskClient, emails: str, admin_token: str) -> None:
    body = {"cron": "0 9 * * *", "timezone": "UTC", "data": {}}
    assert client.put("/v1/queues/emails/schedules/daily", json=body, headers=auth(admin_token)).status_code == 201
    # its next occurrence is a pending event: the queue is not empty
    assert_problem(client.delete("/v1/queues/emails", headers=auth(admin_token)), 409)
    deleted = client.delete("/v1/queues/emails?cancel_open=true", headers=auth(admin_token))
    assert deleted.status_code == 200 and deleted.json["cancelled"] == 1
    assert client.put("/v1/queues/emails", json={}, headers=auth(admin_token)).status_code == 201
    assert client.get("/v1/queues/emails/schedules", headers=auth(admin_token)).json["schedules"] == []


def test_delete_queue_with_only_finished_events(client: FlaskClient, emails: str, token: str, admin_token: str) -> None:
    make_dead(client, token, "dead")
    response = client.delete("/v1/queues/emails", headers=auth(admin_token))
    assert response.status_code == 200 and response.json["cancelled"] == 0 and response.json["deleted_events"] == 1


def test_a_retry_during_the_deletion_of_its_queue_waits_and_adds_nothing(
    client: FlaskClient, emails: str, token: str, store: Store, database_url: str, raw: psycopg.Connection
) -> None:
    """A deletion locks the queue row first; a retry that comes meanwhile waits for that lock
    before it touches the dead event, then finds no queue: no event is added to a deleted queue,
    and neither side deadlocks on the other's rows."""
    make_dead(client, token, "k")
    outcome: list[BaseException | Event] = []

    def retry_now() -> None:
        try:
            outcome.append(store.events.retry("emails", "k", actor="ops"))
        except BaseException as error:
            outcome.append(error)

    named = {"name": "emails"}
    with psycopg.connect(libpq_url(database_url)) as deleting:  # the steps of QueueOperations.delete
        assert run(deleting, driver_sql("lock_queue_for_delete"), named)
        retrying = threading.Thread(target=retry_now)
        retrying.start()
        wait_until(lambda: _waits_for_a_lock(raw, "queue_kept"), what="the retry waiting for the queue row")
        for step in ("delete_queue_events", "delete_queue_counts", "delete_queue_due_counts", "delete_queue"):
            run(deleting, driver_sql(step), named)
        deleting.commit()
    retrying.join(timeout=30)
    assert [type(error) for error in outcome] == [NotFound]
    assert rows_of(raw, "tickler_event WHERE queue = 'emails'") == 0


def _waits_for_a_lock(raw: psycopg.Connection, query_part: str) -> bool:
    found = raw.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, %s) > 0",
        [query_part],
    ).fetchone()
    return found is not None and found[0] > 0


def rows_of(raw: psycopg.Connection, table_and_where: str) -> int:
    found = raw.execute(f"SELECT count(*) FROM {table_and_where}").fetchone()
    assert found is not None
    return int(found[0])


def test_retry_racing_a_new_event_of_the_key(
    client: FlaskClient, emails: str, token: str, live_server: str, raw: psycopg.Connection
) -> None:
    """A retry and a schedule of the same key at once: one of them opens the key, the other is
    refused (409), never a 500 and never two open events."""
    rounds = 6
    for n in range(rounds):
        make_dead(client, token, f"contest:{n}")
    results: list[tuple[int, int]] = []

    def contest(n: int) -> None:
        barrier = threading.Barrier(2)
        codes: dict[str, int] = {}

        def retry_it() -> None:
            with requests.Session() as session:
                barrier.wait(timeout=30)
                url = f"{live_server}{key_url(f'contest:{n}', suffix='/retry')}"
                codes["retry"] = session.post(url, headers=auth(token), timeout=30).status_code

        def schedule_it() -> None:
            with requests.Session() as session:
                barrier.wait(timeout=30)
                body = {"item_key": f"contest:{n}", "data": {}}
                url = f"{live_server}/v1/queues/emails/events"
                codes["schedule"] = session.post(url, json=body, headers=auth(token), timeout=30).status_code

        threads = [threading.Thread(target=retry_it), threading.Thread(target=schedule_it)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        results.append((codes["retry"], codes["schedule"]))

    for n in range(rounds):
        contest(n)
    for retry_code, schedule_code in results:
        assert (retry_code, schedule_code) in {(200, 409), (409, 202)}, results
    open_events = raw.execute(
        "SELECT item_key, count(*) FROM tickler_event_all WHERE item_key LIKE 'contest:%%' AND dequeued_on IS NULL"
        " GROUP BY item_key"
    ).fetchall()
    assert sorted(open_events) == [(f"contest:{n}", 1) for n in range(rounds)]
