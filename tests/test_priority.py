"""Priority and fair share (SPEC §10): claim order by priority then due time (strict), across
batches and claimers; round robin across fairness keys with a skewed backlog; the per-key cap,
in one process and across worker processes and pull consumers at once; groups; the timeline,
search filters and refused values."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, schedule, written
from tests.helpers_http import QuietHandler, serving
from tests.helpers_wait import wait_until
from tests.test_flow import SharedDelivery
from tests.test_flow import shared_delivery as shared_delivery
from tests.test_plans import claim_plan, plan, scanned, schedule_keyed_backlog
from tests.test_plans import fresh_install as fresh_install
from tickler.config import Settings
from tickler.scheduler.models import Lease, NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store


def db_now(raw: psycopg.Connection[Any]) -> datetime:
    row = raw.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def claimed_keys(leases: list[Lease]) -> list[str]:
    return [event.item_key for lease in leases for event in lease.events]


def drain(store: Store, queue: Queue, batch: int, now: datetime, worker: str = "w") -> list[list[str]]:
    """Claim `batch` at a time until nothing is left; the keys of each claim, in order."""
    batches = []
    while leases := store.leases.claim(queue, worker=worker, limit=batch, now=now):
        batches.append(claimed_keys(leases))
    return batches


# -- order: priority, then due time -------------------------------------------------------------


def test_claims_take_higher_priority_first_then_earlier_due_time_across_batches(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    now = db_now(raw)
    # (key, priority, due seconds from now): the due time order is the reverse of the priority order
    wanted = [("low-early", -5, -50), ("mid-a", 0, -40), ("mid-b", 0, -30), ("high-late", 7, -1), ("top", 100, -2)]
    store.events.schedule_batch(
        queue,
        [NewEvent(k, {}, priority=p, schedule_on=now + timedelta(seconds=s)) for k, p, s in wanted]
        + [NewEvent("future-top", {}, priority=100, schedule_on=now + timedelta(hours=1))],
        actor="test",
    )
    batches = drain(store, queue, 2, now)
    assert batches == [["top", "high-late"], ["mid-a", "mid-b"], ["low-early"]]
    # strict: a due event waits while higher-priority due events remain, however long it waited;
    # a future event of the highest priority holds nothing back
    assert [e.item_key for e in store.events.search("emails", store_filter(statuses={"pending"}))] == ["future-top"]


def store_filter(**fields: Any) -> Any:
    from tickler.scheduler.store.search import SearchFilter

    if "statuses" in fields:
        fields["statuses"] = frozenset(fields["statuses"])
    return SearchFilter(**fields)


def test_concurrent_claimers_never_take_a_lower_priority_before_a_higher_one(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    now = db_now(raw)
    levels = (-10, 0, 10)
    store.events.schedule_batch(
        queue,
        [
            NewEvent(f"p{p}-{i}", {}, priority=p, schedule_on=now - timedelta(seconds=i % 7))
            for p in levels
            for i in range(60)
        ],
        actor="test",
    )
    order: list[tuple[int, int]] = []  # (claim sequence, priority), by claim completion
    turns = threading.Condition()
    turn = [0]  # whose claim is next: the claimers take turns, each on a session of its own
    done = threading.Event()

    def claimer(n: int) -> None:
        while True:
            with turns:
                turns.wait_for(lambda: done.is_set() or turn[0] % 4 == n)
                if done.is_set():
                    return
                leases = store.leases.claim(queue, worker=f"w{n}", limit=5, now=now)
                order.extend((len(order), e.priority) for lease in leases for e in lease.events)
                if not leases:
                    done.set()
                turn[0] += 1
                turns.notify_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    priorities = [p for _, p in order]
    assert len(priorities) == 180
    assert priorities == sorted(priorities, reverse=True)
    claimers = {row[0] for row in raw.execute("SELECT DISTINCT claimed_by FROM tickler_event")}
    assert claimers == {"w0", "w1", "w2", "w3"}


# -- fair share -----------------------------------------------------------------------------------


def test_fair_share_hands_out_keys_round_robin_with_a_skewed_backlog(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    big = [NewEvent(f"big-{i:03}", {}, fairness_key="big", schedule_on=now - timedelta(minutes=10)) for i in range(200)]
    small = [
        NewEvent(f"small-{n}", {}, fairness_key=f"tenant-{n}", schedule_on=now - timedelta(seconds=1)) for n in range(9)
    ]
    store.events.schedule_batch(queue, big + small, actor="test")
    batches = drain(store, queue, 5, now)
    # first two batches: every key once (the big key's backlog takes one place per batch)
    first, second = batches[0], batches[1]
    assert sum(k.startswith("big-") for k in first) == 1 and sum(k.startswith("big-") for k in second) <= 1
    assert {k for k in first + second if k.startswith("small-")} == {f"small-{n}" for n in range(9)}
    # then the big key drains at the full batch size, in due order
    assert all(len(b) == 5 for b in batches[2:-1])
    big_order = [k for b in batches for k in b if k.startswith("big-")]
    assert big_order == sorted(big_order)
    assert sum(len(b) for b in batches) == 209


def test_fair_share_goes_on_round_robin_across_claims(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """With more keys than a batch holds, the next claim starts after the last key served."""
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    store.events.schedule_batch(
        queue,
        [
            NewEvent(f"{k}-{i}", {}, fairness_key=k, schedule_on=now - timedelta(seconds=i))
            for k in "abcde"
            for i in range(3)
        ],
        actor="test",
    )
    batches = [[k.split("-")[0] for k in b] for b in drain(store, queue, 3, now)]
    assert batches[:5] == [["a", "b", "c"], ["d", "e", "a"], ["b", "c", "d"], ["e", "a", "b"], ["c", "d", "e"]]


def test_fair_share_keeps_priority_first(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    due = now - timedelta(seconds=1)
    store.events.schedule_batch(
        queue,
        [NewEvent(f"a-{i}", {}, fairness_key="a", schedule_on=due) for i in range(4)]
        + [
            NewEvent("b-urgent", {}, fairness_key="b", priority=5, schedule_on=due),
            NewEvent("c-0", {}, schedule_on=due),
        ],
        actor="test",
    )
    batches = drain(store, queue, 3, now)
    assert batches[0][0] == "b-urgent"
    assert set(batches[0][1:]) == {"a-0", "c-0"}  # then one of each key at priority 0 (no key: a key of its own)


# -- max_in_flight_per_key ------------------------------------------------------------------------


def test_max_in_flight_per_key_caps_live_leases_per_key(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", max_in_flight_per_key=2)
    now = db_now(raw)
    store.events.schedule_batch(
        queue,
        [
            NewEvent(f"{k}-{i}", {}, fairness_key=k, schedule_on=now - timedelta(seconds=1))
            for k in "ab"
            for i in range(5)
        ],
        actor="test",
    )
    first = store.leases.claim(queue, worker="w", limit=10, now=now)
    assert sorted(k.split("-")[0] for k in claimed_keys(first)) == ["a", "a", "b", "b"]
    assert store.leases.claim(queue, worker="w", limit=10, now=now) == []
    store.leases.ack([first[0].lease_id], now=now)
    again = store.leases.claim(queue, worker="w", limit=10, now=now)
    assert [k.split("-")[0] for k in claimed_keys(again)] == [first[0].events[0].item_key.split("-")[0]]
    # an expired lease is over: its key has room again
    later = now + timedelta(seconds=queue.lease_seconds + 1)
    assert len(claimed_keys(store.leases.claim(queue, worker="w", limit=10, now=later))) == 4


@contextmanager
def per_key_receiver(seconds: float, company: int) -> Iterator[tuple[dict[str, int], list[int], str]]:
    """A webhook receiver that records the most requests of one fairness key at once.

    Each request is held until `company` requests of its key are in at once, or for `seconds`: so
    that the cap, and not how the deliveries happened to interleave on a busy machine, decides how
    many overlap (a request alone still ends after `seconds`)."""
    changed = threading.Condition()
    current: dict[str, int] = {}
    most: dict[str, int] = {}
    ids: list[int] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = json.loads(self.body())
            key = body["events"][0].get("fairness_key") or ""
            with changed:
                current[key] = current.get(key, 0) + 1
                most[key] = max(most.get(key, 0), current[key])
                changed.notify_all()
                changed.wait_for(lambda: most[key] >= company, timeout=seconds)
                current[key] -= 1
                ids.extend(event["id"] for event in body["events"])
            self.send_response(204)
            self.end_headers()

    with serving(Handler, backlog=128) as base:
        yield most, ids, f"{base}/hook"


def most_leases_live_per_key(raw: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    """The most leases of each fairness key live at once, from the timeline (claimed entry to the
    entry that ended the lease)."""
    rows = raw.execute(
        """SELECT e.fairness_key, t.details->>'lease_id', min(t.at) FILTER (WHERE t.action = 'claimed'),
                  coalesce(min(t.at) FILTER (WHERE t.action <> 'claimed'), now())
           FROM tickler_timeline_entry AS t JOIN tickler_event_all AS e ON e.id = t.event_id
           WHERE t.queue = %s AND t.details ? 'lease_id' GROUP BY 1, 2""",
        (queue,),
    ).fetchall()
    most: dict[str, int] = {}
    for key in {row[0] for row in rows}:
        edges = sorted(
            [(start, 1) for k, _, start, _ in rows if k == key] + [(end, -1) for k, _, _, end in rows if k == key],
            key=lambda edge: (edge[0], edge[1]),
        )
        live = top = 0
        for _, step in edges:
            live += step
            top = max(top, live)
        most[key] = top
    return most


@pytest.mark.slow
def test_max_in_flight_per_key_holds_across_worker_processes_and_pull_consumers(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], shared_delivery: SharedDelivery
) -> None:
    cap, keys, per_key = 2, 6, 12
    with per_key_receiver(2.0, company=cap) as (most, ids, url):
        queue = make_queue("hooks", delivery_mode="webhook", webhook_url=url, max_in_flight_per_key=cap)
        with shared_delivery(url) as worker_logs:
            events = [
                NewEvent(f"k{k}-{i}", {}, fairness_key=f"tenant-{k}") for k in range(keys) for i in range(per_key)
            ]
            store.events.schedule_batch(queue, events, actor="test")
            wait_until(
                lambda: len(set(ids)) == keys * per_key,
                timeout=120,
                what=lambda: f"{len(set(ids))} of {keys * per_key} received\n{worker_logs()}",
            )
    claimers = {row[0].split("/")[0] for row in raw.execute("SELECT DISTINCT claimed_by FROM tickler_event_all")}
    assert len(claimers) >= 2, claimers  # the work was really shared between processes
    assert max(most.values()) <= cap, most
    assert max(most.values()) >= 2  # the cap, not a lack of work, was what held it
    assert max(most_leases_live_per_key(raw, "hooks").values()) <= cap


# -- groups ---------------------------------------------------------------------------------------


def test_a_group_is_claimed_as_one_unit_with_its_highest_due_priority(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    now = db_now(raw)
    early = now - timedelta(minutes=5)
    store.events.schedule_batch(
        queue,
        [
            NewEvent("old-1", {}, group_key="old", schedule_on=early),
            NewEvent("urgent-1", {}, group_key="urgent", schedule_on=now - timedelta(seconds=1)),
            NewEvent("urgent-2", {}, group_key="urgent", priority=9, schedule_on=now - timedelta(seconds=2)),
            NewEvent("urgent-later", {}, group_key="urgent", priority=50, schedule_on=now + timedelta(hours=1)),
        ],
        actor="test",
    )
    first = store.leases.claim(queue, worker="w", limit=1, now=now)
    assert [lease.group_key for lease in first] == ["urgent"]
    assert sorted(claimed_keys(first)) == ["urgent-1", "urgent-2"]  # the future one stays
    assert [lease.group_key for lease in store.leases.claim(queue, worker="w", limit=1, now=now)] == ["old"]


def test_a_group_has_one_fairness_key_or_the_call_is_refused(
    client: FlaskClient, token: str, emails: str, raw: psycopg.Connection[Any]
) -> None:
    assert schedule(client, token, "g-1", group_key="g", fairness_key="tenant-a").status_code == 202
    before = written(raw)
    refused = schedule(client, token, "g-2", group_key="g", fairness_key="tenant-b")
    assert_problem(refused, 400, "fairness_key")
    batch = client.post(
        "/v1/queues/emails/events/batch",
        json={
            "events": [
                {"item_key": "h-1", "group_key": "h", "data": {}},
                {"item_key": "h-2", "group_key": "h", "fairness_key": "x", "data": {}},
            ]
        },
        headers=auth(token),
    )
    assert_problem(batch, 400, "fairness_key")
    moved = client.patch(key_url("g-1"), json={"fairness_key": "tenant-b"}, headers=auth(token))
    assert moved.status_code == 200  # the only open event of its group: the group's key moves with it
    assert written(raw)[0] == before[0]
    assert schedule(client, token, "g-3", group_key="g", fairness_key="tenant-b").status_code == 202


def test_a_group_lease_counts_once_against_its_key(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", max_in_flight_per_key=1)
    now = db_now(raw)
    due = now - timedelta(seconds=1)
    store.events.schedule_batch(
        queue,
        [
            NewEvent(f"g{g}-{i}", {}, group_key=f"g{g}", fairness_key="t", schedule_on=due)
            for g in range(2)
            for i in range(3)
        ]
        + [NewEvent("single", {}, fairness_key="t", schedule_on=due)],
        actor="test",
    )
    leases = store.leases.claim(queue, worker="w", limit=10, now=now, groups_first=True)
    assert len(leases) == 1 and len(leases[0].events) == 3


# -- the API: JSON, timeline, search, refusals ----------------------------------------------------


def test_priority_and_fairness_key_in_event_json_timeline_and_search(
    client: FlaskClient, token: str, emails: str
) -> None:
    created = schedule(client, token, "a", priority=5, fairness_key="tenant-1", delay_seconds=60)
    assert created.status_code == 202, created.json
    assert created.json is not None
    assert created.json["priority"] == 5 and created.json["fairness_key"] == "tenant-1"
    plain = schedule(client, token, "b", delay_seconds=60).json
    assert plain is not None and plain["priority"] == 0 and plain["fairness_key"] is None
    changed = client.patch(key_url("a"), json={"priority": -3, "delay_seconds": 120}, headers=auth(token))
    assert changed.status_code == 200 and changed.json is not None and changed.json["priority"] == -3
    timeline = client.get(key_url("a", suffix="/timeline"), headers=auth(token)).json
    assert timeline is not None
    enqueued, rescheduled = timeline["entries"]
    assert enqueued["action"] == "enqueued"
    assert enqueued["details"]["priority"] == 5 and enqueued["details"]["fairness_key"] == "tenant-1"
    assert rescheduled["action"] == "rescheduled"
    assert rescheduled["details"]["priority"] == -3 and rescheduled["details"]["previous_priority"] == 5
    assert rescheduled["details"]["fairness_key"] == "tenant-1"

    def keys(query: str) -> list[str]:
        page = client.get(f"/v1/queues/emails/events?{query}", headers=auth(token)).json
        assert page is not None
        return [e["item_key"] for e in page["events"]]

    assert keys("priority=-3") == ["a"]
    assert keys("priority=0") == ["b"]
    assert keys("fairness_key=tenant-1") == ["a"]
    assert_problem(client.get("/v1/queues/emails/events?priority=101", headers=auth(token)), 400, "priority")
    assert_problem(client.get("/v1/queues/emails/events?fairness_key=a/b", headers=auth(token)), 400, "fairness_key")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 101),
        ("priority", -101),
        ("priority", "high"),
        ("priority", 1.5),
        ("priority", None),
        ("priority", True),
        ("fairness_key", ""),
        ("fairness_key", "a/b"),
        ("fairness_key", "a b"),
        ("fairness_key", 7),
        ("fairness_key", "x" * 256),
    ],
)
def test_bad_priority_or_fairness_key_is_400_naming_the_field(
    client: FlaskClient, token: str, emails: str, raw: psycopg.Connection[Any], field: str, value: Any
) -> None:
    before = written(raw)
    assert_problem(schedule(client, token, "k", **{field: value}), 400, field)
    batch = client.post(
        "/v1/queues/emails/events/batch",
        json={"events": [{"item_key": "ok", "data": {}}, {"item_key": "bad", "data": {}, field: value}]},
        headers=auth(token),
    )
    body = assert_problem(batch, 400)
    assert any(field in name for name in body["errors"]), body
    assert written(raw) == before
    assert schedule(client, token, "k").status_code == 202
    assert_problem(client.patch(key_url("k"), json={field: value}, headers=auth(token)), 400, field)


def test_queue_settings_fair_share_and_max_in_flight_per_key(client: FlaskClient, admin_token: str) -> None:
    made = client.put(
        "/v1/queues/tenants", json={"fair_share": True, "max_in_flight_per_key": 3}, headers=auth(admin_token)
    )
    assert made.status_code == 201 and made.json is not None
    assert made.json["fair_share"] is True and made.json["max_in_flight_per_key"] == 3
    kept = client.put("/v1/queues/tenants", json={"lease_seconds": 10}, headers=auth(admin_token)).json
    assert kept is not None and kept["fair_share"] is True and kept["max_in_flight_per_key"] == 3
    cleared = client.put(
        "/v1/queues/tenants", json={"max_in_flight_per_key": None, "fair_share": False}, headers=auth(admin_token)
    ).json
    assert cleared is not None and cleared["fair_share"] is False and cleared["max_in_flight_per_key"] is None
    for body, field in (({"fair_share": "yes"}, "fair_share"), ({"max_in_flight_per_key": 0}, "max_in_flight_per_key")):
        assert_problem(client.put("/v1/queues/tenants", json=body, headers=auth(admin_token)), 400, field)


# -- plans ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("analysed", [False, True])
def test_priority_and_fair_claims_stay_on_their_indexes(request: pytest.FixtureRequest, analysed: bool) -> None:
    """20,000 future events in 3 priority levels over 1,000 fairness keys, 150 due: the claim reads
    the priority index level by level, and the fair pick probes keys, never a scan of the events
    and never the future events one by one."""
    store, raw = request.getfixturevalue("fresh_install")
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    schedule_keyed_backlog(store, queue)
    if analysed:
        raw.execute("ANALYZE tickler_event")
    claim = json.dumps(claim_plan(raw))  # tickler_claim_events()'s statement, on its generic plan
    assert "tickler_event_claimable_priority" in claim and not scanned(claim), claim
    fair = plan(
        raw,
        "claim_events_fair",
        {
            "queue": "emails",
            "worker": "w",
            "limit": 100,
            "lease_seconds": 30,
            "now": db_now(raw),
            "cap": 2,
            "claimed_at": None,
        },
    )
    assert not scanned(fair), fair
    # The pick is PL/pgSQL: what it read is in this transaction's statistics.
    raw.execute("BEGIN")
    try:
        picked = raw.execute("SELECT cardinality(tickler_fair_pick('emails', now(), 100, 2))").fetchone()
        tables = raw.execute("SELECT pg_stat_get_xact_numscans('tickler_event'::regclass)").fetchone()
        scans = raw.execute(
            "SELECT pg_stat_get_xact_tuples_returned('tickler_event_claimable_fair'::regclass)"
            " + pg_stat_get_xact_tuples_returned('tickler_event_claimable_priority'::regclass)"
        ).fetchone()
    finally:
        raw.execute("ROLLBACK")  # the events stay as they were
    assert picked is not None and picked[0] == 100
    assert tables is not None and tables[0] == 0  # sequential scans of the events' table
    # keys looked at (at most 10 per event wanted, per level) and their due events: not the 20,000
    assert scans is not None and scans[0] < 5_000, scans


# -- command line ---------------------------------------------------------------------------------


def test_cli_events_list_and_show_carry_priority(
    store: Store, make_queue: Callable[..., Queue], capsys: pytest.CaptureFixture[str]
) -> None:
    from tickler.cli import _parser
    from tickler.commands import events as events_command

    queue = make_queue("emails")
    store.events.schedule_batch(
        queue, [NewEvent("urgent", {}, priority=42, fairness_key="t1"), NewEvent("plain", {})], actor="test"
    )
    events_command.run(store, _parser().parse_args(["events", "list", "emails"]))
    table = capsys.readouterr().out
    assert "PRIORITY" in table.splitlines()[0]
    assert any("urgent" in line and " 42 " in f" {line} " for line in table.splitlines())
    events_command.run(store, _parser().parse_args(["events", "list", "emails", "--priority", "42", "--json"]))
    assert [e["item_key"] for e in json.loads(capsys.readouterr().out)["events"]] == ["urgent"]
    events_command.run(store, _parser().parse_args(["events", "show", "emails", "urgent"]))
    shown = capsys.readouterr().out
    assert "priority" in shown and "42" in shown and "t1" in shown
    with pytest.raises(SystemExit):
        _parser().parse_args(["events", "list", "emails", "--priority", "101"])


# -- recurring schedules --------------------------------------------------------------------------


def test_a_schedule_gives_its_priority_and_fairness_key_to_every_occurrence(
    client: FlaskClient, token: str, emails: str, store: Store
) -> None:
    body = {"cron": "0 3 * * *", "timezone": "UTC", "data": {}, "priority": 8, "fairness_key": "tenant-9"}
    made = client.put("/v1/queues/emails/schedules/nightly", json=body, headers=auth(token))
    assert made.status_code == 201, made.json
    assert made.json is not None and (made.json["priority"], made.json["fairness_key"]) == (8, "tenant-9")
    (waiting,) = store.events.search("emails", store_filter(statuses={"pending"}))
    assert (waiting.priority, waiting.fairness_key) == (8, "tenant-9")
    changed = client.put("/v1/queues/emails/schedules/nightly", json={**body, "priority": -1}, headers=auth(token))
    assert changed.status_code == 200
    (waiting,) = store.events.search("emails", store_filter(statuses={"pending"}))
    assert waiting.priority == -1  # the occurrence already waiting follows the schedule
    refused = client.put("/v1/queues/emails/schedules/nightly", json={**body, "priority": 500}, headers=auth(token))
    assert_problem(refused, 400, "priority")
