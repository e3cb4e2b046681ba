"""When each event last changed (`changed_on`): it moves with every change, as the timeline does,
and searches sort by it both ways, across open and finished events, through the API, the
command line, the export and the dashboard."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, schedule
from tickler.scheduler.db import driver_rows
from tickler.scheduler.models import Event, NewEvent, Queue
from tickler.scheduler.rules import parse_rfc3339
from tickler.scheduler.store import SearchFilter, Store, search

NOW = datetime.now(UTC).replace(microsecond=0)


def _event(client: FlaskClient, token: str, item_key: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(key_url(item_key), headers=auth(token)).get_json()
    return body


def _latest_entry(client: FlaskClient, token: str, item_key: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = client.get(key_url(item_key, suffix="/timeline"), headers=auth(token)).get_json()[
        "entries"
    ]
    return entries[-1]


def test_changed_on_follows_every_change_of_an_event(client: FlaskClient, admin_token: str, emails: str) -> None:
    steps: list[tuple[str, str, datetime]] = []

    def step(name: str) -> None:
        event, entry = _event(client, admin_token, "walk"), _latest_entry(client, admin_token, "walk")
        changed = parse_rfc3339(event["changed_on"])
        if steps:
            assert changed > steps[-1][2], f"{name}: changed_on did not move"
        assert event["changed_on"] == entry["at"], name  # the change wrote this entry at the same time
        steps.append((name, entry["action"], changed))

    assert schedule(client, admin_token, "walk", delay_seconds=3600).status_code == 202
    step("schedule")
    moved = client.patch(key_url("walk"), json={"delay_seconds": 0}, headers=auth(admin_token))
    assert (
        moved.status_code == 200 and moved.get_json()["changed_on"] == _event(client, admin_token, "walk")["changed_on"]
    )
    step("reschedule")

    def claim() -> str:
        claimed = client.post(
            "/v1/queues/emails/claims", json={"worker": "w", "limit": 1}, headers=auth(admin_token)
        ).get_json()
        [lease] = claimed["leases"]
        return str(lease["lease_id"])

    lease = claim()
    step("claim")
    nacked = client.post(
        f"/v1/leases/{lease}/nack", json={"error": "boom", "retry_in_seconds": 0}, headers=auth(admin_token)
    )
    assert nacked.status_code == 200
    step("nack")
    lease = claim()
    step("claim again")
    assert client.post(f"/v1/leases/{lease}/ack", headers=auth(admin_token)).status_code == 200
    step("ack")
    finished = _event(client, admin_token, "walk")
    assert finished["status"] == "delivered" and finished["changed_on"] == finished["dequeued_on"]
    assert [action for _, action, _ in steps] == [
        "enqueued",
        "rescheduled",
        "claimed",
        "failed",
        "claimed",
        "delivered",
    ]


@pytest.fixture
def changed_in_order(client: FlaskClient, admin_token: str, emails: str) -> list[str]:
    """Five events of `emails`, written together, then changed one after another: the keys from
    the least to the most recently changed (`e` never changed; `a` and `c` finished)."""
    later = (NOW + timedelta(hours=1)).isoformat()
    batch: list[dict[str, Any]] = [{"item_key": k, "data": {}, "schedule_on": later} for k in ("a", "b", "d", "e")]
    batch.append({"item_key": "c", "data": {}, "schedule_on": (NOW - timedelta(hours=1)).isoformat()})
    assert (
        client.post("/v1/queues/emails/events/batch", json={"events": batch}, headers=auth(admin_token)).status_code
        == 200
    )
    assert client.patch(key_url("b"), json={"data": {"n": 1}}, headers=auth(admin_token)).status_code == 200
    assert client.delete(key_url("a"), headers=auth(admin_token)).status_code == 200
    [lease] = client.post(
        "/v1/queues/emails/claims", json={"worker": "w", "limit": 1}, headers=auth(admin_token)
    ).get_json()["leases"]
    assert client.post(f"/v1/leases/{lease['lease_id']}/ack", headers=auth(admin_token)).status_code == 200
    assert client.patch(key_url("d"), json={"delay_seconds": 60}, headers=auth(admin_token)).status_code == 200
    return ["e", "b", "a", "c", "d"]


def _pages(client: FlaskClient, token: str, **query: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    query["limit"] = 2
    while True:
        page = client.get("/v1/queues/emails/events", query_string=query, headers=auth(token)).get_json()
        seen += page["events"]
        if page["next_cursor"] is None:
            return seen
        query["cursor"] = page["next_cursor"]


def test_the_api_sorts_by_last_change_both_ways_across_open_and_finished_events(
    client: FlaskClient, admin_token: str, changed_in_order: list[str]
) -> None:
    oldest_first = _pages(client, admin_token, sort="changed")
    assert [e["item_key"] for e in oldest_first] == changed_in_order
    times = [e["changed_on"] for e in oldest_first]
    assert times == sorted(times)
    assert {e["item_key"]: e["status"] for e in oldest_first}["c"] == "delivered"
    newest_first = _pages(client, admin_token, sort="-changed")
    assert [e["item_key"] for e in newest_first] == changed_in_order[::-1]
    finished = _pages(client, admin_token, sort="-changed", status="delivered,cancelled")
    assert [e["item_key"] for e in finished] == ["c", "a"]
    bad = client.get("/v1/queues/emails/events?sort=change", headers=auth(admin_token))
    assert "-changed" in assert_problem(bad, 400, "sort")["errors"]["sort"][0]


def test_the_export_and_the_cli_sort_by_last_change(
    client: FlaskClient, admin_token: str, store: Store, changed_in_order: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    exported = client.get("/v1/queues/emails/export?sort=-changed", headers=auth(admin_token)).get_data(as_text=True)
    assert [json.loads(line)["item_key"] for line in exported.splitlines()] == changed_in_order[::-1]
    csv_head = client.get("/v1/queues/emails/export?format=csv", headers=auth(admin_token)).get_data(as_text=True)
    assert "changed_on" in csv_head.splitlines()[0].split(",")

    from tickler.cli import _parser
    from tickler.commands import events as events_command

    def listed(*args: str) -> list[str]:
        capsys.readouterr()  # the requests' log lines above
        events_command.run(store, _parser().parse_args(["events", "list", "emails", *args, "--json"]))
        return [e["item_key"] for e in json.loads(capsys.readouterr().out)["events"]]

    assert listed("--sort=-changed", "--limit", "2") == changed_in_order[::-1][:2]
    assert listed("--sort", "changed") == changed_in_order
    with pytest.raises(SystemExit):
        _parser().parse_args(["events", "list", "emails", "--sort", "change"])


def test_history_read_a_window_at_a_time_finds_what_one_sort_finds(
    store: Store, make_queue: Callable[..., Queue], engine: sa.Engine
) -> None:
    """The finished part by last change, read between the bounds of history's days (as many
    branches under one LIMIT), pages exactly as one sort of all of history does, both ways, with
    open events among them; here the bounds are any times between the finishes."""
    queue = make_queue("emails")
    start = NOW - timedelta(days=3)
    store.events.schedule_batch(queue, [NewEvent(f"k{i:02}", {}) for i in range(24)], actor="svc", now=start)
    for i in range(0, 24, 3):  # two of three finish, an hour apart, over three days
        for key in (f"k{i:02}", f"k{i + 1:02}"):
            store.events.cancel("emails", key, actor="svc", now=start + timedelta(hours=9 * i + i % 2))
    days = [start + timedelta(hours=h) for h in (-5, 20, 21, 44, 100)]
    for sort, statuses in itertools.product(search.SORTS[2:], (search.ALL_STATUSES, frozenset({"cancelled"}))):
        cursors: list[tuple[datetime, int] | None] = [None, None]
        pages: list[list[int]] = [[], []]
        for _ in range(6):
            for n, bounds in enumerate((days, None)):
                where = SearchFilter(statuses=statuses, limit=5, after=cursors[n], **search.sort_order(sort))
                query = search.statement(search.build_query("emails", where, None, bounds), engine.dialect)
                found = [Event.from_row(row) for row in driver_rows(engine, *query)]
                pages[n] += [e.id for e in found]
                cursors[n] = where.position(found[-1]) if found else cursors[n]
        assert pages[0] == pages[1] and len(pages[0]) == (24 if statuses == search.ALL_STATUSES else 16), sort


def test_replace_debounce_release_expiry_and_cancel_move_changed_on(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    """Each at its own (injected) time: the event's changed_on is that time, and its latest entry's."""
    queue = make_queue("emails")
    t0 = NOW - timedelta(hours=1)
    at = [t0 + timedelta(minutes=n) for n in range(8)]

    def check(key: str, when: datetime) -> None:
        event = store.events.get("emails", key)
        assert (event.changed_on, store.events.timeline("emails", key)[-1].at) == (when, when), key

    store.events.schedule_batch(queue, [NewEvent(f"k{i}", {}, schedule_on=t0) for i in range(4)], actor="a", now=at[0])
    check("k3", at[0])
    store.events.schedule_batch(
        queue, [NewEvent("k0", {"v": 2}, schedule_on=t0)], actor="a", on_conflict="replace", now=at[1]
    )
    check("k0", at[1])
    store.events.schedule_batch(
        queue, [NewEvent("k1", {}, schedule_on=t0)], actor="a", on_conflict="debounce", now=at[2]
    )
    check("k1", at[2])
    leases = {
        lease.events[0].item_key: lease
        for lease in store.leases.claim(queue, worker="w", limit=4, lease_seconds=90, now=at[3])
    }
    assert sorted(leases) == ["k0", "k1", "k2", "k3"]
    check("k2", at[3])
    store.leases.release([leases["k0"].lease_id], actor="w", now=at[4])
    check("k0", at[4])
    store.leases.expire(queue="emails", now=at[5])  # k1..k3: their leases ran out (at[4] + 30 s)
    check("k1", at[5])
    store.events.cancel("emails", "k0", actor="a", now=at[6])
    check("k0", at[6])
    assert store.events.get("emails", "k0").dequeued_on == at[6]


def test_every_statement_that_bumps_version_sets_changed_on() -> None:
    """changed_on moves wherever version does: each `version = e.version + 1` of the code files and
    named queries is followed by its changed_on (a new statement that forgets it fails here)."""
    root = Path(__file__).resolve().parent.parent / "tickler" / "scheduler"
    for path in sorted(root.rglob("*.sql")):
        if path.name == "schema.sql":
            continue
        text = path.read_text()
        for found in re.finditer(r"version = e\.version \+ 1", text):
            assert re.match(r",\s*changed_on = ", text[found.end() :]), (
                f"{path.name}: {text[found.start() - 200 : found.end()]}"
            )
