"""on_conflict "debounce" (SPEC §6): latest wins, capped at first enqueue + debounce_max_seconds."""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, put_in_flight, schedule, written
from tickler.scheduler.errors import InFlight
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store


def _timeline(client: FlaskClient, token: str, key: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = client.get(key_url(key, suffix="/timeline"), headers=auth(token)).json["entries"]
    return entries


def test_debounce_without_an_open_event_creates_it(client: FlaskClient, emails: str, token: str) -> None:
    response = schedule(client, token, "k", delay_seconds=60, on_conflict="debounce", data={"n": 1})
    assert response.status_code == 202, response.json
    assert response.json["outcome"] == "created"
    assert [e["action"] for e in _timeline(client, token, "k")] == ["enqueued"]


def test_debounce_takes_the_latest_data_group_and_time(client: FlaskClient, emails: str, token: str) -> None:
    first = schedule(client, token, "k", schedule_on="2030-01-01T09:00:00Z", group_key="g1", data={"n": 1}).json
    response = schedule(client, token, "k", schedule_on="2030-01-01T08:00:00Z", group_key="g2", data={"n": 2},
                        on_conflict="debounce")  # fmt: skip
    assert response.status_code == 200, response.json
    event = response.json
    assert event["outcome"] == "debounced"
    assert (event["id"], event["version"]) == (first["id"], 2)
    assert (event["data"], event["group_key"], event["schedule_on"]) == ({"n": 2}, "g2", "2030-01-01T08:00:00Z")
    assert event["enqueued_on"] == first["enqueued_on"]  # the same occurrence
    assert response.headers["ETag"] == '"2"'
    entries = _timeline(client, token, "k")
    assert [e["action"] for e in entries] == ["enqueued", "debounced"]
    assert entries[1]["schedule_on"] == "2030-01-01T08:00:00Z"
    assert entries[1]["details"]["previous_schedule_on"] == "2030-01-01T09:00:00Z"
    assert entries[1]["actor"] == "signup-service"


def test_debounce_never_goes_past_first_enqueue_plus_the_max(client: FlaskClient, emails: str, token: str) -> None:
    first = schedule(client, token, "k", delay_seconds=5).json
    response = schedule(client, token, "k", delay_seconds=3600, on_conflict="debounce", debounce_max_seconds=30)
    assert response.status_code == 200, response.json
    enqueued = datetime.fromisoformat(first["enqueued_on"])
    assert datetime.fromisoformat(response.json["schedule_on"]) == enqueued + timedelta(seconds=30)
    # within the cap, the asked time wins
    inside = schedule(client, token, "k", delay_seconds=1, on_conflict="debounce", debounce_max_seconds=30).json
    assert datetime.fromisoformat(inside["schedule_on"]) < enqueued + timedelta(seconds=30)


def test_the_cap_counts_from_the_first_enqueue_not_the_last_debounce(store: Store, make_queue: Any) -> None:
    queue = make_queue("emails")
    t0 = datetime(2030, 1, 1, 9, tzinfo=UTC)
    event, outcome = store.events.schedule(queue, NewEvent("k", {"n": 0}, delay_seconds=60), actor="a", now=t0)
    assert (outcome, event.schedule_on) == ("created", t0 + timedelta(seconds=60))
    for n, at in enumerate([t0 + timedelta(seconds=50), t0 + timedelta(seconds=100)], start=1):
        event, outcome = store.events.schedule(queue, NewEvent("k", {"n": n}, delay_seconds=60), actor="a",
                                               on_conflict="debounce", now=at, debounce_max_seconds=120)  # fmt: skip
        assert outcome == "debounced"
    # asked: t0 + 160 s; the occurrence was first enqueued at t0, so it is due by t0 + 120 s
    assert (event.schedule_on, event.data, event.enqueued_on) == (t0 + timedelta(seconds=120), {"n": 2}, t0)


def test_debounce_of_an_event_in_flight_is_409(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, "k", data={"n": 1})
    put_in_flight(raw, "k")
    before = written(raw)
    response = schedule(client, token, "k", data={"n": 2}, on_conflict="debounce")
    body = assert_problem(response, 409)
    assert body["event"]["data"] == {"n": 1}
    assert written(raw) == before


def test_debounce_after_the_lease_ran_out(store: Store, make_queue: Any, raw: psycopg.Connection[Any]) -> None:
    queue = make_queue("emails")
    store.events.schedule(queue, NewEvent("k", {"n": 1}), actor="a")
    put_in_flight(raw, "k", expired=True)
    event, outcome = store.events.schedule(queue, NewEvent("k", {"n": 2}), actor="a", on_conflict="debounce")
    assert (outcome, event.data, event.status, event.redeliver_count) == ("debounced", {"n": 2}, "pending", 1)
    put_in_flight(raw, "k")
    try:
        store.events.schedule(queue, NewEvent("k", {"n": 3}), actor="a", on_conflict="debounce")
    except InFlight as error:
        assert error.extra["event"].data == {"n": 2}
    else:
        raise AssertionError("a debounce of an event in flight must raise InFlight")


def test_debounce_in_a_batch(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    old = schedule(client, token, "old", delay_seconds=3600, data={"v": 1}).json
    busy = schedule(client, token, "busy", data={"v": 1}).json
    put_in_flight(raw, "busy")
    body = {
        "events": [{"item_key": k, "delay_seconds": 7200, "data": {"v": 2}} for k in ("old", "busy", "new")],
        "on_conflict": "debounce",
        "debounce_max_seconds": 60,
    }
    response = client.post("/v1/queues/emails/events/batch", json=body, headers=auth(token))
    assert response.status_code == 200, response.json
    results = response.json["results"]
    assert [(r["item_key"], r["outcome"]) for r in results] == [
        ("old", "debounced"), ("busy", "rejected"), ("new", "created")]  # fmt: skip
    assert (results[0]["id"], results[1]["id"]) == (old["id"], busy["id"])
    got = client.get(key_url("old"), headers=auth(token)).json
    enqueued = datetime.fromisoformat(old["enqueued_on"])
    assert (got["data"], datetime.fromisoformat(got["schedule_on"])) == ({"v": 2}, enqueued + timedelta(seconds=60))
    # a new key is created as asked: the cap applies to debounces of an existing occurrence
    new = client.get(key_url("new"), headers=auth(token)).json
    assert datetime.fromisoformat(new["schedule_on"]) - datetime.fromisoformat(new["enqueued_on"]) == timedelta(hours=2)
    assert client.get(key_url("busy"), headers=auth(token)).json["data"] == {"v": 1}


def test_bad_debounce_max_seconds_is_refused(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    for bad in (-1, "10", None, True):
        response = schedule(client, token, "k", on_conflict="debounce", debounce_max_seconds=bad)
        assert_problem(response, 400, "debounce_max_seconds")
    batch = {"events": [{"item_key": "k", "data": {}}], "on_conflict": "debounce", "debounce_max_seconds": -5}
    response = client.post("/v1/queues/emails/events/batch", json=batch, headers=auth(token))
    assert_problem(response, 400, "debounce_max_seconds")
    assert written(raw) == (0, 0)


def test_debounce_max_seconds_has_no_effect_on_other_modes(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, "k", delay_seconds=5)
    replaced = schedule(client, token, "k", delay_seconds=3600, on_conflict="replace", debounce_max_seconds=1).json
    assert replaced["outcome"] == "replaced"
    asked = datetime.fromisoformat(replaced["enqueued_on"]) + timedelta(seconds=3600)
    assert datetime.fromisoformat(replaced["schedule_on"]) >= asked


def test_thirty_racing_debounces_leave_one_event_and_one_entry_each(
    live_server: str, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    racers = 30
    start = threading.Barrier(racers)
    answers: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def race(n: int) -> None:
        body = {"item_key": "digest:ana", "delay_seconds": 600, "data": {"racer": n}, "on_conflict": "debounce"}
        request = urllib.request.Request(
            f"{live_server}/v1/queues/emails/events",
            data=json.dumps(body).encode(),
            headers={**auth(token), "Content-Type": "application/json"},
            method="POST",
        )
        start.wait()
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = (response.status, json.loads(response.read()))
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == racers
    assert sorted(status for status, _ in answers) == [200] * (racers - 1) + [202]
    assert sorted(body["outcome"] for _, body in answers) == ["created"] + ["debounced"] * (racers - 1)

    open_events = raw.execute(
        "SELECT data, version FROM tickler_event_all WHERE item_key = 'digest:ana' AND dequeued_on IS NULL"
    ).fetchall()
    assert len(open_events) == 1
    data, version = open_events[0]
    assert data["racer"] in range(racers) and version == racers
    # the last writer's answer is the event as it stands
    last = max((body for _, body in answers), key=lambda body: body["version"])
    assert last["data"] == data
    actions = [row[0] for row in raw.execute(
        "SELECT action FROM tickler_timeline WHERE item_key = 'digest:ana' ORDER BY id")]  # fmt: skip
    assert actions == ["enqueued"] + ["debounced"] * (racers - 1)
    assert raw.execute("SELECT count(*) FROM tickler_event_all").fetchone() == (1,)
