"""Searching a queue's events by `due`, due time bounds, fairness key and priority, in either order
of due time, through the API, the command line and the dashboard; exporting a search as CSV or
JSON Lines; and the dashboard's fair backlogs counting grouped events."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem
from tests.test_ui import csrf_of, kill, sign_in
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.store.ui_reads import UIReads

NOW = datetime.now(UTC).replace(microsecond=0)


def _put(store: Store, queue: Queue, *events: NewEvent) -> None:
    store.events.schedule_batch(queue, list(events), actor="svc")


def _keys(body: dict[str, Any]) -> list[str]:
    return [e["item_key"] for e in body["events"]]


@pytest.fixture
def mixed(store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]) -> Queue:
    """`emails`: three due events (one in a group), two in the future, one in flight, one dead."""
    queue = make_queue("emails")
    _put(
        store,
        queue,
        NewEvent("due:1", {}, schedule_on=NOW - timedelta(hours=3), fairness_key="acme", priority=5),
        NewEvent("due:2", {}, schedule_on=NOW - timedelta(hours=2), fairness_key="acme"),
        NewEvent("due:3", {}, schedule_on=NOW - timedelta(hours=1), group_key="g", fairness_key="zeta"),
        NewEvent("later:1", {}, schedule_on=NOW + timedelta(hours=1), fairness_key="acme"),
        NewEvent("later:2", {}, schedule_on=NOW + timedelta(days=2)),
        NewEvent("busy", {}, schedule_on=NOW - timedelta(hours=4), priority=9),
        NewEvent("gone", {}, schedule_on=NOW - timedelta(hours=5)),
    )
    kill(raw, "gone")
    [lease] = store.leases.claim(queue, worker="w", limit=1)  # the earliest due, left in flight
    assert [e.item_key for e in lease.events] == ["busy"]
    return queue


# -- the API ----------------------------------------------------------------------------------------


def test_the_api_searches_due_events_and_bounds_due_time(client: FlaskClient, admin_token: str, mixed: Queue) -> None:
    due = client.get("/v1/queues/emails/events?status=due", headers=auth(admin_token))
    assert _keys(due.get_json()) == ["due:1", "due:2", "due:3"]  # pending and due: not in flight, not later
    with_flight = client.get("/v1/queues/emails/events?status=due,in_flight", headers=auth(admin_token))
    assert _keys(with_flight.get_json()) == ["busy", "due:1", "due:2", "due:3"]
    until = (NOW + timedelta(hours=2)).isoformat()
    bounded = client.get(
        "/v1/queues/emails/events", query_string={"status": "pending", "due_until": until}, headers=auth(admin_token)
    )
    assert _keys(bounded.get_json()) == ["due:1", "due:2", "due:3", "later:1"]
    window = client.get(
        "/v1/queues/emails/events",
        query_string={"due_from": (NOW - timedelta(hours=2, minutes=30)).isoformat(), "due_until": until},
        headers=auth(admin_token),
    )
    assert _keys(window.get_json()) == ["due:2", "due:3", "later:1"]
    acme = client.get("/v1/queues/emails/events?fairness_key=acme&priority=0", headers=auth(admin_token))
    assert _keys(acme.get_json()) == ["due:2", "later:1"]


def test_the_api_sorts_by_latest_due_time_across_pages(client: FlaskClient, admin_token: str, mixed: Queue) -> None:
    seen: list[str] = []
    query: dict[str, Any] = {"sort": "-due", "limit": 3}
    while True:
        page = client.get("/v1/queues/emails/events", query_string=query, headers=auth(admin_token)).get_json()
        seen += _keys(page)
        if page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    assert seen == ["later:2", "later:1", "due:3", "due:2", "due:1", "busy", "gone"]


def test_the_api_refuses_bad_search_arguments_per_field(client: FlaskClient, admin_token: str, emails: str) -> None:
    bad = client.get(
        "/v1/queues/emails/events",
        query_string={"status": "overdue", "sort": "key", "due_until": "tomorrow"},
        headers=auth(admin_token),
    )
    assert_problem(bad, 400, "status", "sort", "due_until")
    backwards = client.get(
        "/v1/queues/emails/events",
        query_string={"due_from": "2030-01-02T00:00:00Z", "due_until": "2030-01-01T00:00:00Z"},
        headers=auth(admin_token),
    )
    assert_problem(backwards, 400, "due_until")
    export = client.get("/v1/queues/emails/export?format=xlsx&status=lost", headers=auth(admin_token))
    assert_problem(export, 400, "format", "status")


# -- the command line -------------------------------------------------------------------------------


def test_the_cli_lists_due_events_until_a_time(store: Store, mixed: Queue, capsys: pytest.CaptureFixture[str]) -> None:
    from tickler.cli import _parser
    from tickler.commands import events as events_command

    def listed(*args: str) -> list[str]:
        events_command.run(store, _parser().parse_args(["events", "list", "emails", *args, "--json"]))
        return _keys(json.loads(capsys.readouterr().out))

    assert listed("--status", "due") == ["due:1", "due:2", "due:3"]
    until = (NOW - timedelta(hours=1, minutes=30)).isoformat()
    assert listed("--status", "due", "--due-until", until) == ["due:1", "due:2"]
    assert listed("--status", "pending", "--sort=-due", "--limit", "2") == ["later:2", "later:1"]
    with pytest.raises(SystemExit):
        _parser().parse_args(["events", "list", "emails", "--status", "overdue"])


# -- the dashboard ----------------------------------------------------------------------------------


def _listed(page: str) -> list[str]:
    return re.findall(r'<a href="/ui/queues/emails/events/[^"]+"><code>([^<]+)</code></a>', page)


def test_the_dashboard_lists_due_events_and_links_the_due_and_dead_counts(
    client: FlaskClient, admin_token: str, mixed: Queue
) -> None:
    sign_in(client, admin_token)
    overview = client.get("/ui/").get_data(as_text=True)
    assert 'href="/ui/queues/emails?status=due"' in overview
    assert 'href="/ui/queues/emails?status=dead"' in overview
    queue_page = client.get("/ui/queues/emails").get_data(as_text=True)
    assert 'href="/ui/queues/emails?status=due"' in queue_page and 'href="/ui/queues/emails?status=dead"' in queue_page
    # The page opens on the latest due events first, and says so.
    assert _listed(queue_page) == ["later:2", "later:1", "due:3", "due:2", "due:1", "busy", "gone"]
    assert "sorted by due time, latest first" in queue_page
    due = client.get("/ui/queues/emails?status=due&sort=due").get_data(as_text=True)
    assert _listed(due) == ["due:1", "due:2", "due:3"]
    until = (NOW - timedelta(hours=1, minutes=30)).strftime("%Y-%m-%dT%H:%M")
    bounded = client.get(f"/ui/queues/emails?status=due&until={until}&sort=due").get_data(as_text=True)
    assert _listed(bounded) == ["due:1", "due:2"]
    acme = client.get("/ui/queues/emails?fairness_key=acme&priority=5").get_data(as_text=True)
    assert _listed(acme) == ["due:1"]


def test_the_dashboard_pages_back_and_forth_latest_first(client: FlaskClient, admin_token: str, emails: str) -> None:
    from tests.helpers import schedule

    base = datetime(2030, 1, 1, tzinfo=UTC)
    for i in range(120):
        schedule(client, admin_token, f"user:{i:03d}", schedule_on=(base + timedelta(minutes=i)).isoformat())
    sign_in(client, admin_token)
    pages = [client.get("/ui/queues/emails").get_data(as_text=True)]
    assert "120 events match" in pages[0]
    while (found := re.search(r'href="([^"]+)" rel="next"', pages[-1])) is not None:
        pages.append(client.get(html.unescape(found[1])).get_data(as_text=True))
    listed = [key for page in pages for key in _listed(page)]
    assert listed == [f"user:{i:03d}" for i in reversed(range(120))]
    back = re.search(r'href="([^"]+)" rel="prev"', pages[2])
    assert back is not None
    assert _listed(client.get(html.unescape(back[1])).get_data(as_text=True)) == _listed(pages[1])
    until = client.get("/ui/queues/emails?until=2030-01-01T00:09").get_data(as_text=True)
    assert _listed(until) == [f"user:{i:03d}" for i in reversed(range(10))]


def test_the_bulk_box_offers_no_action_for_filters_it_cannot_apply(
    client: FlaskClient, admin_token: str, mixed: Queue
) -> None:
    sign_in(client, admin_token)
    invalid = client.get("/ui/queues/emails?status=overdue&item_key_prefix=due:")
    text = invalid.get_data(as_text=True)
    assert invalid.status_code == 400 and "Not a status" in text
    assert "/events/cancel?" not in text and "/events/retry?" not in text  # no bulk button
    assert "not offered" in text
    due = client.get("/ui/queues/emails?status=due&item_key_prefix=due:").get_data(as_text=True)
    assert "/events/cancel?" not in due and "Cancel</b> is not offered" in due  # due is narrower than pending
    pending = client.get("/ui/queues/emails?status=pending&item_key_prefix=due:").get_data(as_text=True)
    assert "/events/cancel?status=pending&amp;item_key_prefix=due" in pending
    # The confirmation refuses the same filters when reached directly, and changes nothing.
    confirm = client.get("/ui/queues/emails/events/cancel?status=due&item_key_prefix=due:")
    assert confirm.status_code == 400
    refused = client.post(
        "/ui/queues/emails/events/cancel",
        data={"csrf_token": csrf_of(confirm), "status": "overdue", "item_key_prefix": "due:"},
    )
    assert refused.status_code in (302, 303, 400)
    assert client.get("/v1/queues/emails/events?status=pending", headers=auth(admin_token)).get_json()["events"]


def test_fair_backlogs_count_grouped_events(
    client: FlaskClient, admin_token: str, store: Store, engine: sa.Engine, make_queue: Callable[..., Queue]
) -> None:
    """Keys whose due events are all in groups are listed, with their grouped events counted."""
    queue = make_queue("emails", fair_share=True)
    past = NOW - timedelta(minutes=10)
    _put(store, queue, *(NewEvent(f"solo:{i}", {}, schedule_on=past, fairness_key="solo") for i in range(3)))
    for key, n in (("tenant-a", 5), ("tenant-b", 4)):
        grouped = [
            NewEvent(f"{key}:{i}", {}, schedule_on=past, fairness_key=key, group_key=f"{key}:g") for i in range(n)
        ]
        _put(store, queue, *grouped)
    _put(store, queue, NewEvent("mixed:1", {}, schedule_on=past, fairness_key="solo", group_key="m"))
    backlogs = UIReads(engine).fair_backlogs("emails")
    assert backlogs.keys == [("tenant-a", 5), ("solo", 4), ("tenant-b", 4)]
    assert backlogs.grouped == {"tenant-a": 5, "solo": 1, "tenant-b": 4}
    assert backlogs.seen == 13 and not backlogs.more
    capped = UIReads(engine).fair_backlogs("emails", scan=2)
    assert capped.more
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails").get_data(as_text=True)
    table = page[page.index('id="fair-backlogs"') :]
    assert "tenant-a" in table and "tenant-b" in table and "in groups" in table


# -- export -----------------------------------------------------------------------------------------


def test_export_streams_csv_and_json_lines_with_the_search_filters(
    client: FlaskClient, admin_token: str, token: str, mixed: Queue
) -> None:
    jsonl = client.get("/v1/queues/emails/export?status=due&sort=-due", headers=auth(admin_token))
    assert jsonl.status_code == 200 and jsonl.mimetype == "application/jsonl"
    assert jsonl.is_streamed
    lines = [json.loads(line) for line in jsonl.get_data(as_text=True).splitlines()]
    assert [e["item_key"] for e in lines] == ["due:3", "due:2", "due:1"]
    assert lines[0]["status"] == "pending" and lines[0]["group_key"] == "g"
    exported = client.get("/v1/queues/emails/export?format=csv&fairness_key=acme", headers=auth(token))
    assert exported.mimetype == "text/csv"
    assert 'filename="emails-events.csv"' in exported.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(exported.get_data(as_text=True))))
    assert [r["item_key"] for r in rows] == ["due:1", "due:2", "later:1"]
    assert rows[0]["priority"] == "5" and json.loads(rows[0]["data"]) == {} and rows[0]["group_key"] == ""
    assert (
        client.get("/v1/queues/emails/export?limit=2", headers=auth(admin_token)).get_data(as_text=True).count("\n")
        == 2
    )
    assert client.get("/v1/queues/other/export", headers=auth(token)).status_code == 404


def test_the_dashboard_links_the_export_of_its_filters(client: FlaskClient, admin_token: str, mixed: Queue) -> None:
    sign_in(client, admin_token)
    page = client.get("/ui/queues/emails?status=due&sort=due").get_data(as_text=True)
    found = re.search(r'href="([^"]+format=csv[^"]*)"', page)
    assert found is not None
    exported = client.get(html.unescape(found[1]))
    assert exported.status_code == 200 and exported.mimetype == "text/csv"
    rows = list(csv.DictReader(io.StringIO(exported.get_data(as_text=True))))
    assert [r["item_key"] for r in rows] == ["due:1", "due:2", "due:3"]
    assert client.get("/ui/queues/emails/export?status=lost").status_code == 400


def _resident_bytes() -> int:
    """This process's resident memory (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_an_export_of_100000_events_streams_in_bounded_memory(
    client: FlaskClient, admin_token: str, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """The export reads a page at a time and writes it out: the memory it holds does not grow
    with the number of events. The whole answer is ~25 MB, and 100,000 events held at once take
    several times that; while it streams, the process grows by less than 16 MB."""
    make_queue("emails")
    raw.execute(
        "INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_by, max_attempts)"
        " SELECT 'emails', format('bulk:%s', lpad(i::text, 6, '0')),"
        " timestamptz '2030-01-01' + i * interval '1 second',"
        " jsonb_build_object('n', i, 'note', repeat('x', 100)), 'svc', 10 FROM generate_series(0, 99999) AS i"
    )
    response = client.get("/v1/queues/emails/export?format=csv", headers=auth(admin_token), buffered=False)
    assert response.status_code == 200
    rows = size = grown = 0
    last = ""
    before = _resident_bytes()
    try:
        for chunk in response.response:
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            rows += text.count("\r\n")
            size += len(text)
            last = text
            if rows % 1000 == 0:
                grown = max(grown, _resident_bytes() - before)
    finally:
        response.close()
    assert rows == 100_001  # the header and every event
    assert "bulk:099999" in last
    assert size > 20_000_000
    assert grown < 16_000_000, grown
