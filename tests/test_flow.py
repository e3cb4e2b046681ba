"""Flow control (SPEC §6) and pause (§7) as the claims enforce them, in the database: the queue
settings, max_in_flight and rate_per_second in one process with an injected clock, and both held
across several worker processes and pull consumers at once."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers_http import QuietHandler, serving
from tests.helpers_wait import wait_until
from tests.workers.spawn import logs, start_worker, stop_workers
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store


def schedule(store: Store, queue: Queue, n: int, *, prefix: str = "k", group: str | None = None) -> None:
    events = [NewEvent(f"{prefix}{i}", {"i": i}, group_key=group) for i in range(n)]
    store.events.schedule_batch(queue, events, actor="test")


def db_now(raw: psycopg.Connection[Any]) -> datetime:
    row = raw.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


Filled = Callable[..., tuple[Queue, datetime]]


@pytest.fixture
def filled(store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]) -> Filled:
    """filled(name, n, **settings): a queue made with `settings` and `n` events scheduled now; returns
    it and an instant a second past the database's clock, when all of them are due."""

    def fill(name: str, n: int, **settings: Any) -> tuple[Queue, datetime]:
        queue = make_queue(name, **settings)
        schedule(store, queue, n)
        return queue, db_now(raw) + timedelta(seconds=1)

    return fill


def pause(store: Store, name: str, paused: bool = True) -> None:
    """Pause or resume as the operations API does."""
    if paused:
        store.queues.pause(name)
    else:
        store.queues.resume(name)


# -- settings ---------------------------------------------------------------------------------------


def test_queue_json_carries_flow_settings_and_paused(client: FlaskClient, admin_token: str) -> None:
    created = client.put("/v1/queues/emails", json={"max_in_flight": 3}, headers=auth(admin_token))
    assert created.status_code == 201, created.json
    assert (created.json["max_in_flight"], created.json["rate_per_second"], created.json["paused"]) == (3, None, False)
    changed = client.put("/v1/queues/emails", json={"rate_per_second": 2.5}, headers=auth(admin_token))
    assert (changed.json["max_in_flight"], changed.json["rate_per_second"]) == (3, 2.5)  # omitted: kept
    cleared = client.put("/v1/queues/emails", json={"max_in_flight": None}, headers=auth(admin_token))
    assert (cleared.json["max_in_flight"], cleared.json["rate_per_second"]) == (None, 2.5)  # null: no cap
    shown = client.get("/v1/queues/emails", headers=auth(admin_token)).json
    assert (shown["max_in_flight"], shown["rate_per_second"], shown["paused"]) == (None, 2.5, False)


def test_a_webhook_queue_gets_the_default_cap_unless_told(client: FlaskClient, admin_token: str) -> None:
    hook = {"mode": "webhook", "url": "http://127.0.0.1:9/hook"}
    default = client.put("/v1/queues/hooks", json={"delivery": hook}, headers=auth(admin_token)).json
    assert default["max_in_flight"] == 1000
    uncapped = client.put("/v1/queues/open", json={"delivery": hook, "max_in_flight": None}, headers=auth(admin_token))
    assert uncapped.json["max_in_flight"] is None
    pull = client.put("/v1/queues/pulled", json={}, headers=auth(admin_token)).json
    assert pull["max_in_flight"] is None  # a pull consumer paces itself
    again = client.put("/v1/queues/hooks", json={"max_attempts": 3}, headers=auth(admin_token)).json
    assert again["max_in_flight"] == 1000


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 1.5}, "max_in_flight"),
        ({"max_in_flight": "3"}, "max_in_flight"),
        ({"max_in_flight": True}, "max_in_flight"),
        ({"rate_per_second": 0}, "rate_per_second"),
        ({"rate_per_second": -1}, "rate_per_second"),
        ({"rate_per_second": "fast"}, "rate_per_second"),
    ],
)
def test_bad_flow_settings_are_400_and_change_nothing(
    client: FlaskClient, admin_token: str, body: dict[str, Any], field: str
) -> None:
    client.put("/v1/queues/emails", json={"max_in_flight": 7}, headers=auth(admin_token))
    response = client.put("/v1/queues/emails", json=body, headers=auth(admin_token))
    assert response.status_code == 400
    assert response.content_type == "application/problem+json"
    assert field in response.json["errors"]
    shown = client.get("/v1/queues/emails", headers=auth(admin_token)).json
    assert (shown["max_in_flight"], shown["rate_per_second"]) == (7, None)


# -- one process, injected clock --------------------------------------------------------------------


def test_max_in_flight_caps_live_leases_and_an_expired_lease_is_over(store: Store, filled: Filled) -> None:
    queue, now = filled("capped", 10, max_in_flight=3, lease_seconds=30)
    first = store.leases.claim_within_limits(queue, worker="a", limit=10, now=now)
    assert len(first.leases) == 3 and first.room_in is not None
    assert store.leases.claim_within_limits(queue, worker="b", limit=10, now=now).leases == []
    store.leases.ack([first.leases[0].lease_id], now=now)
    assert len(store.leases.claim_within_limits(queue, worker="b", limit=10, now=now).leases) == 1
    # Leases whose time is up free their room even before the reaper ends them.
    later = now + timedelta(seconds=31)
    assert len(store.leases.claim_within_limits(queue, worker="c", limit=10, now=later).leases) == 3


def test_a_group_lease_counts_once(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("capped", max_in_flight=2)
    schedule(store, queue, 5, prefix="a", group="ga")
    schedule(store, queue, 5, prefix="b", group="gb")
    schedule(store, queue, 5, prefix="c", group="gc")
    leases = store.leases.claim(queue, worker="a", limit=10, now=db_now(raw) + timedelta(seconds=1))
    assert sorted(len(lease.events) for lease in leases) == [5, 5]


def test_rate_per_second_takes_at_most_the_rate_in_any_second(store: Store, filled: Filled) -> None:
    queue, t0 = filled("paced", 20, rate_per_second=4)
    first = store.leases.claim_within_limits(queue, worker="a", limit=3, now=t0)
    assert len(first.leases) == 3 and first.room_in is None  # asked for fewer than the rate
    second = store.leases.claim_within_limits(queue, worker="b", limit=10, now=t0 + timedelta(milliseconds=500))
    assert len(second.leases) == 1
    assert second.room_in == pytest.approx(0.5)  # the first claim leaves the window then
    held = store.leases.claim_within_limits(queue, worker="b", limit=10, now=t0 + timedelta(milliseconds=999))
    assert held.leases == []
    # The first claim left the window; the second is still in it.
    after = store.leases.claim_within_limits(queue, worker="c", limit=10, now=t0 + timedelta(seconds=1))
    assert len(after.leases) == 3


def test_a_rate_under_one_a_second_takes_one_event_per_period(store: Store, filled: Filled) -> None:
    queue, t0 = filled("slow", 5, rate_per_second=0.5)
    assert len(store.leases.claim(queue, worker="a", limit=10, now=t0)) == 1
    assert store.leases.claim(queue, worker="a", limit=10, now=t0 + timedelta(seconds=1.9)) == []
    assert len(store.leases.claim(queue, worker="a", limit=10, now=t0 + timedelta(seconds=2))) == 1


def test_a_paused_queue_gets_no_claims_even_from_stale_settings(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("work")
    schedule(store, queue, 3)
    schedule(store, queue, 2, prefix="g", group="g")
    pause(store, "work")
    now = db_now(raw) + timedelta(seconds=1)
    assert not queue.paused  # what a process read before the pause: the fast path
    assert store.leases.claim(queue, worker="stale", limit=10, now=now) == []
    assert store.leases.claim(queue, worker="stale", limit=10, groups_first=True, now=now) == []
    fresh = store.queues.get("work")
    claim = store.leases.claim_within_limits(fresh, worker="fresh", limit=10, now=now)
    assert claim.leases == [] and claim.paused
    pause(store, "work", False)
    assert len(store.leases.claim(store.queues.get("work"), worker="w", limit=10, now=now)) == 4


def test_limits_set_after_a_process_read_the_queue_still_hold(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("work")
    schedule(store, queue, 5)
    raw.execute("UPDATE tickler_queue SET max_in_flight = 1 WHERE name = 'work'")
    assert store.leases.claim(queue, worker="stale", limit=10) == []
    assert len(store.leases.claim(store.queues.get("work"), worker="fresh", limit=10)) == 1


def test_a_pull_claim_of_a_paused_queue_waits_and_returns_no_leases(
    client: FlaskClient, admin_token: str, store: Store
) -> None:
    client.put("/v1/queues/emails", json={}, headers=auth(admin_token))
    client.post("/v1/queues/emails/events", json={"item_key": "k", "data": {}}, headers=auth(admin_token))
    pause(store, "emails")
    started = time.monotonic()
    response = client.post(
        "/v1/queues/emails/claims", json={"worker": "w", "limit": 5, "wait_seconds": 0.5}, headers=auth(admin_token)
    )
    assert response.status_code == 200 and response.json == {"leases": []}
    assert time.monotonic() - started >= 0.5  # it long-polled
    pause(store, "emails", False)
    again = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 5}, headers=auth(admin_token))
    assert len(again.json["leases"]) == 1


# -- several processes -----------------------------------------------------------------------------


class CountingReceiver:
    """A real local HTTP server that counts the requests it is handling at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.current = 0
        self.most = 0
        self.ids: list[int] = []

    def enter(self) -> None:
        with self.lock:
            self.current += 1
            self.most = max(self.most, self.current)

    def leave(self, ids: list[int]) -> None:
        with self.lock:
            self.current -= 1
            self.ids.extend(ids)


@contextmanager
def counting_receiver(seconds: float) -> Iterator[tuple[CountingReceiver, str]]:
    counter = CountingReceiver(seconds)

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            counter.enter()
            body = json.loads(self.body())
            time.sleep(counter.seconds)  # the receiver's own work, so that requests overlap
            counter.leave([event["id"] for event in body["events"]])
            self.send_response(204)
            self.end_headers()

    with serving(Handler, backlog=128) as base:  # this test counts concurrency, not the backlog
        yield counter, f"{base}/hook"


def listening(raw: psycopg.Connection[Any]) -> int:
    """Worker processes up and asleep (their LISTEN connections)."""
    row = raw.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tickler-listen'").fetchone()
    return int(row[0]) if row else 0


def most_leases_live(raw: psycopg.Connection[Any], queue: str) -> int:
    """The most leases of `queue` live at once, from the timeline: each lease lives from its
    `claimed` entry to the entry that ended it (delivered, failed, released...)."""
    rows = raw.execute(
        """SELECT details->>'lease_id', min(at) FILTER (WHERE action = 'claimed'),
                  coalesce(min(at) FILTER (WHERE action <> 'claimed'), now())
           FROM tickler_timeline_entry WHERE queue = %s AND details ? 'lease_id' GROUP BY 1""",
        (queue,),
    ).fetchall()
    edges = sorted([(start, 1) for _, start, _ in rows] + [(end, -1) for _, _, end in rows], key=lambda e: (e[0], e[1]))
    live = most = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


def pull_consumer(base_url: str, token: str, queue: str, hook: str, stop: threading.Event) -> None:
    """A pull consumer that hands each lease to the receiver (as a webhook worker would), then acks."""
    api = urlsplit(base_url)
    target = urlsplit(hook)
    conn = http.client.HTTPConnection(api.netloc, timeout=30)
    headers = {**auth(token), "Content-Type": "application/json"}
    while not stop.is_set():
        conn.request("POST", f"/v1/queues/{queue}/claims", json.dumps({"worker": "pull", "limit": 4}), headers)
        leases = json.loads(conn.getresponse().read())["leases"]
        for lease in leases:
            receiver = http.client.HTTPConnection(target.netloc, timeout=30)
            receiver.request("POST", target.path, json.dumps({"events": lease["events"]}), {"Content-Type": "x"})
            receiver.getresponse().read()
            receiver.close()
            conn.request("POST", f"/v1/leases/{lease['lease_id']}/ack", "{}", headers)
            conn.getresponse().read()
        if not leases:
            stop.wait(0.02)


SharedDelivery = Callable[[str], AbstractContextManager[Callable[[], str]]]


@pytest.fixture
def shared_delivery(
    database_url: str, raw: psycopg.Connection[Any], tmp_path: Path, live_server: str, admin_token: str
) -> SharedDelivery:
    """shared_delivery(hook): while in it, three worker processes deliver the webhook queue "hooks"
    and two pull consumers claim from it too, handing each lease to `hook`; the consumers start
    once every worker listens. It yields what reads the workers' logs (for a failure's message);
    all are stopped on the way out."""

    @contextmanager
    def delivering(hook: str) -> Iterator[Callable[[], str]]:
        workers = [start_worker(database_url, tmp_path, name=f"w{n}", webhooks=True) for n in range(3)]
        stop = threading.Event()
        consumers = [
            threading.Thread(target=pull_consumer, args=(live_server, admin_token, "hooks", hook, stop), daemon=True)
            for _ in range(2)
        ]
        try:
            wait_until(lambda: listening(raw) >= 3, timeout=60, what=lambda: logs(tmp_path))
            for consumer in consumers:
                consumer.start()
            yield lambda: logs(tmp_path)
        finally:
            stop.set()
            stop_workers(workers)
            for consumer in consumers:
                consumer.join(timeout=30)

    return delivering


@pytest.mark.slow
def test_max_in_flight_holds_across_worker_processes_and_pull_consumers(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], shared_delivery: SharedDelivery
) -> None:
    cap, events = 4, 120
    with counting_receiver(0.02) as (counter, url):
        queue = make_queue("hooks", delivery_mode="webhook", webhook_url=url, max_in_flight=cap)
        with shared_delivery(url) as worker_logs:
            schedule(store, queue, events)
            wait_until(
                lambda: len(set(counter.ids)) == events,
                timeout=90,
                what=lambda: f"{len(set(counter.ids))} of {events} received\n{worker_logs()}",
            )
    claimers = {row[0].split("/")[0] for row in raw.execute("SELECT DISTINCT claimed_by FROM tickler_event_all")}
    assert len(claimers) >= 2, claimers  # the work was really shared between processes
    assert counter.most <= cap
    assert counter.most >= 2  # the cap, not a lack of work, was what held it
    assert most_leases_live(raw, "hooks") <= cap


@pytest.mark.slow
def test_rate_per_second_holds_across_worker_processes(
    database_url: str, store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rate, events = 20, 70
    queue = make_queue("work", rate_per_second=rate)
    # One delivery at a time, 0.1 s each: one process can take at most 10/s, so reaching the
    # rate takes several processes claiming side by side (the case the limit must hold across).
    workers = [
        start_worker(database_url, tmp_path, "--concurrency", "1", name=f"w{n}", HANDLE_SECONDS="0.1") for n in range(3)
    ]
    try:
        wait_until(lambda: listening(raw) >= 3, timeout=60, what=lambda: logs(tmp_path))
        schedule(store, queue, events)
        wait_until(
            lambda: (
                raw.execute("SELECT count(*) FROM tickler_event_all WHERE outcome = 'delivered'").fetchone()
                == (events,)
            ),
            timeout=60,
            what=lambda: logs(tmp_path),
        )
    finally:
        stop_workers(workers)
    claimed = [
        row[0]
        for row in raw.execute("SELECT at FROM tickler_timeline_entry WHERE action = 'claimed' ORDER BY at").fetchall()
    ]
    assert len(claimed) == events
    assert len({row[0] for row in raw.execute("SELECT claimed_by FROM tickler_event_all")}) >= 2
    second = timedelta(seconds=1)
    busiest = max(sum(1 for t in claimed if start <= t < start + second) for start in claimed)
    assert busiest <= rate
    # The claims waited for the window: 70 events at 20/s span more than three seconds.
    assert claimed[-1] - claimed[0] >= timedelta(seconds=3)
