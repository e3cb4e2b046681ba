"""Search (filters, order, keyset pages under concurrent writes), batches and cancel by filter."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, put_in_flight, rows, schedule, written


def _search(client: FlaskClient, token: str, query: str = "") -> dict[str, Any]:
    response = client.get(f"/v1/queues/emails/events?{query}", headers=auth(token))
    assert response.status_code == 200, response.json
    body: dict[str, Any] = response.json
    return body


def _keys(client: FlaskClient, token: str, query: str = "") -> list[str]:
    return [e["item_key"] for e in _search(client, token, query)["events"]]


def _all_pages(client: FlaskClient, token: str, query: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = _search(client, token, query + (f"&cursor={quote(cursor)}" if cursor else ""))
        seen.extend(page["events"])
        cursor = page["next_cursor"]
        if cursor is None:
            return seen


def test_search_orders_by_schedule_on_then_id(client: FlaskClient, emails: str, token: str) -> None:
    schedule(client, token, "c", schedule_on="2030-01-03T00:00:00Z")
    schedule(client, token, "a", schedule_on="2030-01-01T00:00:00Z")
    schedule(client, token, "b2", schedule_on="2030-01-02T00:00:00Z")
    schedule(client, token, "b1", schedule_on="2030-01-02T00:00:00Z")
    client.delete(key_url("c"), headers=auth(token))  # finished events are found as well
    events = _search(client, token)["events"]
    assert [e["item_key"] for e in events] == ["a", "b2", "b1", "c"]
    assert events[1]["id"] < events[2]["id"]
    assert _search(client, token)["next_cursor"] is None


def test_search_filters_by_status(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    for key in ("p", "f", "x", "c"):
        schedule(client, token, key, delay_seconds=10)
    put_in_flight(raw, "f")
    put_in_flight(raw, "x", expired=True)  # an expired lease is pending again
    client.delete(key_url("c"), headers=auth(token))
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w', outcome = 'dead' WHERE item_key = 'x'"
    )
    schedule(client, token, "p2", delay_seconds=20)
    assert _keys(client, token, "status=pending") == ["p", "p2"]
    assert _keys(client, token, "status=in_flight") == ["f"]
    assert _keys(client, token, "status=cancelled") == ["c"]
    assert _keys(client, token, "status=dead") == ["x"]
    assert _keys(client, token, "status=delivered") == []
    assert sorted(_keys(client, token, "status=cancelled,in_flight")) == ["c", "f"]
    assert sorted(_keys(client, token, "status=pending,dead")) == ["p", "p2", "x"]
    assert sorted(_keys(client, token)) == ["c", "f", "p", "p2", "x"]
    assert [e["status"] for e in _search(client, token, "status=in_flight")["events"]] == ["in_flight"]


def test_search_filters_by_group_and_prefix(client: FlaskClient, emails: str, token: str) -> None:
    for key, group in [("welcome:ana", "ana"), ("welcome:bob", "bob"), ("digest:ana", "ana"), ("welcomes", None)]:
        schedule(client, token, key, group_key=group)
    assert sorted(_keys(client, token, "group_key=ana")) == ["digest:ana", "welcome:ana"]
    assert sorted(_keys(client, token, "item_key_prefix=welcome:")) == ["welcome:ana", "welcome:bob"]
    assert sorted(_keys(client, token, "item_key_prefix=welcome")) == ["welcome:ana", "welcome:bob", "welcomes"]
    assert _keys(client, token, "item_key_prefix=welcome:&group_key=bob") == ["welcome:bob"]
    assert _keys(client, token, "item_key_prefix=nothing") == []


def test_prefix_wildcards_are_literal(client: FlaskClient, emails: str, token: str) -> None:
    for key in ("100%off", "100x", "a_b", "axb", "a\\b"):
        schedule(client, token, key)
    assert _keys(client, token, "item_key_prefix=" + quote("100%")) == ["100%off"]
    assert _keys(client, token, "item_key_prefix=" + quote("a_")) == ["a_b"]
    assert _keys(client, token, "item_key_prefix=" + quote("a\\")) == ["a\\b"]


def test_prefix_with_non_ascii(client: FlaskClient, emails: str, token: str) -> None:
    for key in ("café:1", "café:2", "cafe:3", "caféine", "雪:1", "雪人", "🙂:1", "🙂🙂", "\U0010ffff:x"):
        schedule(client, token, key)
    assert sorted(_keys(client, token, "item_key_prefix=" + quote("café:"))) == ["café:1", "café:2"]
    assert sorted(_keys(client, token, "item_key_prefix=" + quote("café"))) == ["café:1", "café:2", "caféine"]
    assert _keys(client, token, "item_key_prefix=" + quote("雪:")) == ["雪:1"]
    assert sorted(_keys(client, token, "item_key_prefix=" + quote("🙂"))) == ["🙂:1", "🙂🙂"]
    assert _keys(client, token, "item_key_prefix=" + quote("\U0010ffff")) == ["\U0010ffff:x"]


def test_pages_have_no_gaps_or_duplicates(client: FlaskClient, emails: str, token: str) -> None:
    events = [{"item_key": f"k{i:03d}", "schedule_on": f"2030-01-01T00:00:{i % 7:02d}Z", "data": {}} for i in range(95)]
    client.post("/v1/queues/emails/events/batch", json={"events": events}, headers=auth(token))
    seen = _all_pages(client, token, "limit=10")
    assert len(seen) == 95
    assert len({e["id"] for e in seen}) == 95
    order = [(e["schedule_on"], e["id"]) for e in seen]
    assert order == sorted(order)


def test_pages_stay_exact_while_another_thread_inserts(
    client: FlaskClient, app: Any, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    # Existing rows spread over time; concurrent inserts land before, between and after them.
    events = [{"item_key": f"old{i:03d}", "delay_seconds": 100 + i * 10, "data": {}} for i in range(200)]
    client.post("/v1/queues/emails/events/batch", json={"events": events}, headers=auth(token))
    existing = {row[0] for row in raw.execute("SELECT id FROM tickler_event_all").fetchall()}
    stop = threading.Event()
    writing = threading.Event()
    inserted = 0

    def writer() -> None:
        nonlocal inserted
        writer_client = app.test_client()
        while not stop.is_set():
            delay = (inserted * 37) % 2200
            response = schedule(writer_client, token, f"new{inserted:05d}", delay_seconds=delay)
            assert response.status_code == 202
            inserted += 1
            writing.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert writing.wait(timeout=30), "the writer did not start"
        seen = _all_pages(client, token, "limit=7")
    finally:
        stop.set()
        thread.join(timeout=30)
    ids = [e["id"] for e in seen]
    assert len(ids) == len(set(ids)), "an event was returned twice"
    assert existing <= set(ids), "an event that existed before the first page was missed"
    assert inserted > 0, "the writer did not run during the pagination"


def test_limit_and_cursor(client: FlaskClient, emails: str, token: str) -> None:
    for i in range(5):
        schedule(client, token, f"k{i}", delay_seconds=i)
    first = _search(client, token, "limit=2")
    assert [e["item_key"] for e in first["events"]] == ["k0", "k1"]
    second = _search(client, token, f"limit=2&cursor={first['next_cursor']}")
    assert [e["item_key"] for e in second["events"]] == ["k2", "k3"]
    third = _search(client, token, f"limit=2&cursor={second['next_cursor']}")
    assert [e["item_key"] for e in third["events"]] == ["k4"]
    assert third["next_cursor"] is None
    exact = _search(client, token, "limit=5")
    assert len(exact["events"]) == 5 and exact["next_cursor"] is None


# -- batch ----------------------------------------------------------------------------------------


def _batch(client: FlaskClient, token: str, events: list[dict[str, Any]], **extra: Any) -> Any:
    return client.post("/v1/queues/emails/events/batch", json={"events": events, **extra}, headers=auth(token))


def test_batch_outcomes(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    existing = schedule(client, token, "old", data={"v": 1}).json
    events = [{"item_key": "new", "data": {}}, {"item_key": "old", "data": {"v": 2}}]
    rejected = _batch(client, token, events)
    assert rejected.status_code == 200
    results = rejected.json["results"]
    assert results[0]["item_key"] == "new" and results[0]["outcome"] == "created" and isinstance(results[0]["id"], int)
    assert results[1] == {"item_key": "old", "outcome": "rejected", "id": existing["id"]}

    events = [{"item_key": "old", "data": {"v": 3}}, {"item_key": "newer", "data": {}}]
    ignored = _batch(client, token, events, on_conflict="ignore").json["results"]
    assert ignored[0] == {"item_key": "old", "outcome": "ignored", "id": existing["id"]}
    assert ignored[1]["outcome"] == "created"

    replaced = _batch(client, token, [{"item_key": "old", "data": {"v": 4}}], on_conflict="replace").json["results"]
    assert replaced == [{"item_key": "old", "outcome": "replaced", "id": existing["id"]}]
    got = client.get(key_url("old"), headers=auth(token)).json
    assert got["data"] == {"v": 4} and got["version"] == 2

    put_in_flight(raw, "old")
    in_flight = _batch(client, token, [{"item_key": "old", "data": {"v": 5}}], on_conflict="replace").json["results"]
    assert in_flight == [{"item_key": "old", "outcome": "rejected", "id": existing["id"]}]
    assert rows(raw, "tickler_event") == 3
    entries = client.get(key_url("new", suffix="/timeline"), headers=auth(token)).json["entries"]
    assert [(e["action"], e["actor"]) for e in entries] == [("enqueued", "signup-service")]


def test_batch_replace_after_an_expired_lease(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, "a")
    schedule(client, token, "b")
    put_in_flight(raw, "a", expired=True)
    put_in_flight(raw, "b", expired=True)
    events = [{"item_key": "a", "data": {"v": 2}}, {"item_key": "b", "data": {"v": 2}}]
    results = _batch(client, token, events, on_conflict="replace").json["results"]
    assert [r["outcome"] for r in results] == ["replaced", "replaced"]


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([{"item_key": "a", "data": {}}, {"item_key": "b/c", "data": {}}], "events[1].item_key"),
        ([{"item_key": "a", "data": {}}, {"item_key": "b"}], "events[1].data"),
        ([{"item_key": "a", "data": {}, "colour": 1}], "events[0].colour"),
        ([{"item_key": "a", "data": {}, "delay_seconds": -1}], "events[0].delay_seconds"),
        ([{"item_key": "a", "data": {"s": "\u0000"}}], "events[0].data"),
        ([{"item_key": "a", "data": {}}, {"item_key": "a", "data": {}}], "events[1].item_key"),
        (
            [{"item_key": "a", "data": {}, "schedule_on": "2030-01-01T00:00:00Z", "delay_seconds": 1}],
            "events[0].delay_seconds",
        ),
        ([], "events"),
        ([1], "events[0]"),
    ],
)
def test_invalid_batch_writes_nothing(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any], events: list[Any], field: str
) -> None:
    assert_problem(_batch(client, token, events), 400, field)
    assert written(raw) == (0, 0)


def test_batch_body_checks(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    url = "/v1/queues/emails/events/batch"
    assert_problem(client.post(url, json={}, headers=auth(token)), 400, "events")
    assert_problem(client.post(url, json={"events": {}}, headers=auth(token)), 400, "events")
    assert_problem(client.post(url, json={"events": [], "on_conflict": "x"}, headers=auth(token)), 400, "on_conflict")
    assert_problem(
        client.post(url, json={"events": [{"item_key": "a", "data": {}}], "x": 1}, headers=auth(token)), 400, "x"
    )
    assert written(raw) == (0, 0)


def test_batch_of_ten_thousand(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    events = [{"item_key": f"bulk:{i}", "data": {"i": i}, "group_key": f"g{i % 10}"} for i in range(10_000)]
    response = _batch(client, token, events)
    assert response.status_code == 200
    results = response.json["results"]
    assert len(results) == 10_000
    assert [r["item_key"] for r in results] == [e["item_key"] for e in events]
    assert {r["outcome"] for r in results} == {"created"}
    assert len({r["id"] for r in results}) == 10_000
    assert written(raw) == (10_000, 10_000)
    too_many = [*events, {"item_key": "one-more", "data": {}}]
    raw.execute("SET tickler.archiving = 'on'")
    raw.execute("TRUNCATE tickler_event, tickler_timeline")
    assert_problem(_batch(client, token, too_many), 400, "events")
    assert written(raw) == (0, 0)


# -- cancel by filter -----------------------------------------------------------------------------


def test_cancel_by_filter(client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]) -> None:
    for key, group in [
        ("digest:ana:1", "ana"),
        ("digest:ana:2", "ana"),
        ("digest:bob:1", "bob"),
        ("welcome:ana", "ana"),
        ("digest:ana:3", "ana"),
        ("digest:ana_x", None),
    ]:
        schedule(client, token, key, group_key=group, delay_seconds=60)
    put_in_flight(raw, "digest:ana:3")
    url = "/v1/queues/emails/events/cancel"
    response = client.post(
        url, json={"group_key": "ana", "item_key_prefix": "digest:ana:", "reason": "bye"}, headers=auth(token)
    )
    assert response.status_code == 200
    assert response.json == {"cancelled": 2}
    assert client.get(key_url("digest:ana:1"), headers=auth(token)).json["status"] == "cancelled"
    assert client.get(key_url("digest:ana:3"), headers=auth(token)).json["status"] == "in_flight"
    assert client.get(key_url("welcome:ana"), headers=auth(token)).json["status"] == "pending"
    entries = client.get(key_url("digest:ana:2", suffix="/timeline"), headers=auth(token)).json["entries"]
    assert [(e["action"], e["actor"]) for e in entries] == [
        ("enqueued", "signup-service"),
        ("cancelled", "signup-service"),
    ]
    assert entries[1]["details"]["reason"] == "bye"
    assert client.post(url, json={"group_key": "ana"}, headers=auth(token)).json == {"cancelled": 1}
    assert client.post(url, json={"item_key_prefix": "digest:"}, headers=auth(token)).json == {"cancelled": 2}
    assert client.post(url, json={"item_key_prefix": "digest:"}, headers=auth(token)).json == {"cancelled": 0}


def test_cancel_by_filter_needs_a_filter(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, "a")
    before = written(raw)
    url = "/v1/queues/emails/events/cancel"
    assert_problem(client.post(url, json={}, headers=auth(token)), 400)
    assert_problem(client.post(url, json={"reason": "all"}, headers=auth(token)), 400)
    assert_problem(client.post(url, json={"group_key": "a", "x": 1}, headers=auth(token)), 400, "x")
    assert_problem(client.post(url, json={"item_key_prefix": ""}, headers=auth(token)), 400, "item_key_prefix")
    assert written(raw) == before


def test_cancel_by_filter_ends_expired_leases(
    client: FlaskClient, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    schedule(client, token, "a", group_key="g")
    put_in_flight(raw, "a", expired=True)
    assert client.post("/v1/queues/emails/events/cancel", json={"group_key": "g"}, headers=auth(token)).json == {
        "cancelled": 1
    }
    actions = [e["action"] for e in client.get(key_url("a", suffix="/timeline"), headers=auth(token)).json["entries"]]
    assert actions == ["enqueued", "lease_expired", "cancelled"]
