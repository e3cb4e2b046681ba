"""Group commit: concurrent single-event schedules of one API process share one statement, each
answered with its own outcome, and one refused item never fails another."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests
from flask import Flask

from tests.conftest import auth
from tests.helpers_http import serving_app
from tests.helpers_wait import wait_until
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.db import libpq_url
from tickler.scheduler.store.group_commit import GroupCommit

CLIENTS = 16


@pytest.fixture
def grouping_app(settings: Settings) -> Iterator[tuple[str, GroupCommit[Any, Any]]]:
    """The API with a long window (200 ms), its URL and its group commit."""
    app: Flask = create_app(settings.with_overrides(group_commit_ms=200), configure_logs=False)
    try:
        with serving_app(app) as url:
            yield url, app.extensions["tickler"].store.events.groups
    finally:
        close_app(app)


@pytest.fixture
def grouping_server(grouping_app: tuple[str, GroupCommit[Any, Any]]) -> str:
    return grouping_app[0]


def _together(url: str, token: str, bodies: Sequence[dict[str, Any]]) -> list[requests.Response]:
    barrier = threading.Barrier(len(bodies))

    def one(body: dict[str, Any]) -> requests.Response:
        with requests.Session() as session:
            barrier.wait(timeout=30)
            return session.post(f"{url}/v1/queues/emails/events", json=body, headers=auth(token), timeout=30)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def _together_behind_a_held_write(
    grouping_app: tuple[str, GroupCommit[Any, Any]], database_url: str, token: str, bodies: Sequence[dict[str, Any]]
) -> list[requests.Response]:
    """Send `bodies` at once while writes to tickler_event wait on a table lock held until every
    request has submitted: whatever the machine's speed, all of them arrive while a write is under
    way, and the window (raised to 30 s) closes only once none is on its way, so groups certainly
    form: the first write and one group behind it at most."""
    url, groups = grouping_app
    groups.window = 30.0
    with psycopg.connect(libpq_url(database_url)) as blocker:
        blocker.execute("LOCK TABLE tickler_event IN EXCLUSIVE MODE")  # reads go on, writes wait
        pool = ThreadPoolExecutor(len(bodies))
        futures = [
            pool.submit(requests.post, f"{url}/v1/queues/emails/events", json=body, headers=auth(token), timeout=60)
            for body in bodies
        ]
        wait_until(lambda: groups.submitted() == len(bodies), what=lambda: f"{groups.submitted()} submitted")
        blocker.commit()
    try:
        return [future.result() for future in futures]
    finally:
        pool.shutdown()


def _shared_transactions(raw: psycopg.Connection[Any]) -> int:
    """How many events were written in a transaction that wrote another one too (the same now())."""
    row = raw.execute(
        "SELECT coalesce(sum(n), 0) FROM (SELECT count(*) AS n FROM tickler_event GROUP BY enqueued_on "
        "HAVING count(*) > 1) AS shared"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_concurrent_requests_share_a_statement_and_each_gets_its_own_event(
    grouping_app: tuple[str, GroupCommit[Any, Any]],
    database_url: str,
    emails: str,
    token: str,
    raw: psycopg.Connection[Any],
) -> None:
    bodies = [{"item_key": f"k{i}", "data": {"n": i}, "delay_seconds": 60 + i} for i in range(CLIENTS)]
    responses = _together_behind_a_held_write(grouping_app, database_url, token, bodies)
    assert [r.status_code for r in responses] == [202] * CLIENTS
    for i, response in enumerate(responses):
        body = response.json()
        assert (body["item_key"], body["data"], body["outcome"], body["version"]) == (f"k{i}", {"n": i}, "created", 1)
        assert response.headers["ETag"] == '"1"'
        assert response.headers["Location"].endswith(f"/v1/queues/emails/events/k{i}")
    assert len({r.json()["id"] for r in responses}) == CLIENTS
    assert raw.execute("SELECT count(*) FROM tickler_event").fetchone() == (CLIENTS,)
    assert raw.execute("SELECT count(*) FROM tickler_timeline WHERE action = 'enqueued'").fetchone() == (CLIENTS,)
    assert _shared_transactions(raw) >= 2  # at least two requests were written by one statement


def test_one_refused_request_fails_alone_and_conflicts_are_answered_per_request(
    grouping_server: str, emails: str, token: str, raw: psycopg.Connection[Any]
) -> None:
    headers = auth(token)
    for body in (
        {"item_key": "taken", "data": {"old": True}, "delay_seconds": 60},
        {"item_key": "g0", "data": {}, "group_key": "g", "fairness_key": "a", "delay_seconds": 60},
    ):
        assert (
            requests.post(f"{grouping_server}/v1/queues/emails/events", json=body, headers=headers).status_code == 202
        )
    bodies: list[dict[str, Any]] = [{"item_key": f"k{i}", "data": {"n": i}} for i in range(CLIENTS - 2)]
    # refused by the database (the group's events share one fairness key): 400 for this one alone
    bodies.append({"item_key": "mixed", "data": {}, "group_key": "g", "fairness_key": "b"})
    bodies.append({"item_key": "taken", "data": {"new": True}})  # reject: 409 naming the open event
    responses = _together(grouping_server, token, bodies)
    statuses = [r.status_code for r in responses]
    assert statuses == [202] * (CLIENTS - 2) + [400, 409], [r.text for r in responses]
    assert "fairness_key" in responses[-2].json()["errors"]
    assert responses[-1].json()["event"]["data"] == {"old": True}
    for i, response in enumerate(responses[: CLIENTS - 2]):
        assert (response.json()["item_key"], response.json()["data"]) == (f"k{i}", {"n": i})
    # nothing lost, nothing written twice
    keys = [row[0] for row in raw.execute("SELECT item_key FROM tickler_event ORDER BY item_key")]
    assert keys == sorted(["taken", "g0", *(f"k{i}" for i in range(CLIENTS - 2))])
    assert raw.execute("SELECT count(*) FROM tickler_timeline").fetchone() == (CLIENTS,)


def test_a_request_alone_is_written_at_once_whatever_the_window() -> None:
    """A lone request does not wait: with a one-hour window it still returns (the test's timeout)."""
    written: list[list[str]] = []
    groups: GroupCommit[str, str] = GroupCommit(
        lambda key, items: written.append(list(items)) or list(items), window=3600
    )
    with groups.handling():
        assert groups.submit("q", "a", "a") == "a"
    assert written == [["a"]]


def test_a_group_whose_write_fails_writes_each_item_alone() -> None:
    """One statement failed, so nothing of the group was written: each is retried alone and only
    the one the database refuses fails; the others each get their own result."""
    calls: list[list[str]] = []

    def write(key: Any, items: Sequence[str]) -> list[str]:
        calls.append(list(items))
        if "bad" in items:
            raise ValueError("refused")
        return [item.upper() for item in items]

    groups: GroupCommit[str, str] = GroupCommit(write, window=3600)
    results: dict[str, Any] = {}
    inside = threading.Barrier(3)

    def request(item: str) -> None:
        with groups.handling():
            inside.wait(timeout=10)  # all three are being handled before any submits
            try:
                results[item] = groups.submit("q", item, item)
            except ValueError as error:
                results[item] = error

    threads = [threading.Thread(target=request, args=(item,)) for item in ("a", "bad", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results["a"] == "A" and results["c"] == "C"
    assert isinstance(results["bad"], ValueError)
    assert sorted(calls[0]) == ["a", "bad", "c"]  # one group first
    assert sorted(map(tuple, calls[1:])) == [("a",), ("bad",), ("c",)]


class FirstHeld:
    """A group commit of key "q" whose write records the items of each call and holds the write
    of "first" until `release` is set (`entered`: that write began); `start(*items)` sends each
    item as a request of its own thread, whose answer goes to `results`."""

    def __init__(self, window: float) -> None:
        self.calls: list[list[str]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.results: dict[str, str] = {}
        self.groups: GroupCommit[str, str] = GroupCommit(self.write, window=window)

    def write(self, key: Any, items: Sequence[str]) -> list[str]:
        self.calls.append(list(items))
        if items[0] == "first":
            self.entered.set()
            self.release.wait(timeout=30)
        return list(items)

    def request(self, item: str) -> None:
        with self.groups.handling():
            self.results[item] = self.groups.submit("q", item, item)

    def start(self, *items: str) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.request, args=(item,)) for item in items]
        for thread in threads:
            thread.start()
        return threads


def test_requests_that_arrive_while_a_write_is_under_way_share_the_next_one() -> None:
    """No request waits for a lone one's write, but those arriving during it are written together."""
    held = FirstHeld(window=3600)
    first = held.start("first")
    wait_until(lambda: held.calls == [["first"]], what="the lone request writes at once")
    later = held.start("b", "c")
    groups = held.groups
    wait_until(lambda: "q" in groups._open and len(groups._open["q"].items) == 2, what="b and c join one group")
    assert held.calls == [["first"]]  # the group waits for the write under way (the window is an hour)
    held.release.set()
    for thread in first + later:
        thread.join(timeout=30)
    assert held.results == {"first": "first", "b": "b", "c": "c"}
    assert [sorted(call) for call in held.calls] == [["first"], ["b", "c"]]


def test_the_window_is_a_setting_from_0_to_1000_ms() -> None:
    from tickler.config import SettingsError

    assert Settings.from_env({}).group_commit_ms == 2.0
    assert Settings.from_env({"TICKLER_GROUP_COMMIT_MS": "0"}).group_commit_ms == 0.0
    with pytest.raises(SettingsError, match="TICKLER_GROUP_COMMIT_MS"):
        Settings.from_env({"TICKLER_GROUP_COMMIT_MS": "-1"})


def test_grouped_replaces_each_answer_their_own_version_and_etag(
    grouping_app: tuple[str, GroupCommit[Any, Any]],
    database_url: str,
    emails: str,
    token: str,
    raw: psycopg.Connection[Any],
) -> None:
    """Replaces written in one group: each response carries its own event's new version (keys
    replaced 0, 1, 2... times before), its ETag and its data, as a replace alone would."""
    grouping_server, headers = grouping_app[0], auth(token)
    keys = [f"r{i}" for i in range(8)]
    for i, key in enumerate(keys):
        for round_ in range(i + 1):  # r0 written once, r1 written and replaced once, ...
            body = {"item_key": key, "data": {"round": round_}, "delay_seconds": 60, "on_conflict": "replace"}
            response = requests.post(f"{grouping_server}/v1/queues/emails/events", json=body, headers=headers)
            assert response.status_code in (200, 202), response.text
    bodies = [{"item_key": key, "data": {"final": key}, "delay_seconds": 120, "on_conflict": "replace"} for key in keys]
    responses = _together_behind_a_held_write(grouping_app, database_url, token, bodies)
    assert [r.status_code for r in responses] == [200] * len(keys), [r.text for r in responses]
    stored = dict(raw.execute("SELECT item_key, version FROM tickler_event").fetchall())
    for i, (key, response) in enumerate(zip(keys, responses, strict=True)):
        body = response.json()
        assert (body["item_key"], body["outcome"], body["data"]) == (key, "replaced", {"final": key})
        assert body["version"] == stored[key] == i + 2  # i + 1 writes before this replace
        assert response.headers["ETag"] == f'"{stored[key]}"'
    replaced = raw.execute("SELECT count(*) FROM tickler_timeline WHERE action = 'replaced'").fetchone()
    assert replaced == (sum(range(len(keys))) + len(keys),)  # every replace once, none lost or doubled
    shared = raw.execute(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM (SELECT item_key, max(at) AS at FROM tickler_timeline"
        " WHERE action = 'replaced' GROUP BY item_key) AS last GROUP BY at) AS by_transaction"
    ).fetchone()
    assert shared is not None and shared[0] >= 2  # at least two of the last replaces shared one statement


def test_a_window_of_zero_writes_every_item_alone() -> None:
    """TICKLER_GROUP_COMMIT_MS=0: requests on their way and a write under way never make a group."""
    held = FirstHeld(window=0)
    first = held.start("first")
    assert held.entered.wait(timeout=30)
    # a write of the same key is under way: with a window these would wait for it and share one
    later = held.start("b", "c")
    wait_until(lambda: len(held.calls) == 3, timeout=30)
    held.release.set()
    for thread in first + later:
        thread.join(timeout=30)
    assert held.results == {"first": "first", "b": "b", "c": "c"}
    assert sorted(held.calls) == [["b"], ["c"], ["first"]]
