"""Claims and leases at the store level, with real concurrent transactions."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.helpers_wait import wait_until
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.errors import StaleLease
from tickler.scheduler.models import Lease, NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store


def schedule(store: Store, queue: Queue, *events: NewEvent) -> None:
    results = store.events.schedule_batch(queue, list(events), actor="test")
    assert all(r.outcome == "created" for r in results)


def db_now(raw: psycopg.Connection[Any]) -> Any:
    return raw.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


def claim_one(store: Store, make_queue: Callable[..., Queue], worker: str, **settings: Any) -> tuple[Queue, Lease]:
    """The queue `emails` made with `settings`, with one event, `k`, claimed by `worker`."""
    queue = make_queue("emails", **settings)
    schedule(store, queue, NewEvent(item_key="k", data={}))
    [lease] = store.leases.claim(queue, worker=worker, limit=1)
    return queue, lease


def test_classic_race_two_pollers_batch_two_three_events(store: Store, make_queue: Callable[..., Queue]) -> None:
    queue = make_queue("race")
    schedule(store, queue, *(NewEvent(item_key=f"e{i}", data={}) for i in range(3)))
    barrier = threading.Barrier(2)

    def poll(worker: str) -> list[int]:
        barrier.wait()
        seen: list[int] = []
        while leases := store.leases.claim(queue, worker=worker, limit=2):
            seen += [e.id for lease in leases for e in lease.events]
            store.leases.ack([lease.lease_id for lease in leases])
        return seen

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(poll, ["a", "b"])
    assert sorted(a + b) == [1, 2, 3]
    assert store.queues.counts("race")["delivered"] == 3


def test_claim_sets_lease_fields_and_timeline(store: Store, make_queue: Callable[..., Queue]) -> None:
    queue = make_queue("emails", lease_seconds=30)
    schedule(store, queue, NewEvent(item_key="k", data={"a": 1}))
    [lease] = store.leases.claim(queue, worker="svc/w1", limit=10)
    [event] = lease.events
    assert event.status == "in_flight" and event.claimed_by == "svc/w1"
    assert lease.expires_at - event.claimed_on == timedelta(seconds=30)  # type: ignore[operator]
    assert store.events.get("emails", "k").status == "in_flight"
    entry = store.events.timeline("emails", "k")[-1]
    assert (entry.action, entry.actor, entry.details["attempt"]) == ("claimed", "svc/w1", 1)
    assert entry.details["lease_id"] == lease.lease_id


def test_future_events_are_not_claimed(store: Store, make_queue: Callable[..., Queue]) -> None:
    queue = make_queue("emails")
    schedule(store, queue, NewEvent(item_key="later", data={}, delay_seconds=60))
    assert store.leases.claim(queue, worker="w", limit=10) == []
    later = store.events.get("emails", "later").schedule_on
    [lease] = store.leases.claim(queue, worker="w", limit=10, now=later)
    assert lease.events[0].item_key == "later"


def test_group_is_claimed_whole_and_a_future_member_does_not_block_it(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    queue = make_queue("digests")
    schedule(
        store,
        queue,
        NewEvent(item_key="a1", group_key="ana", data={}),
        NewEvent(item_key="a2", group_key="ana", data={}),
        NewEvent(item_key="a-future", group_key="ana", data={}, delay_seconds=3600),
        NewEvent(item_key="b1", group_key="bob", data={}),
    )
    leases = store.leases.claim(queue, worker="w", limit=10, groups_first=True)
    by_group = {lease.group_key: sorted(e.item_key for e in lease.events) for lease in leases}
    assert by_group == {"ana": ["a1", "a2"], "bob": ["b1"]}
    assert store.events.get("digests", "a-future").status == "pending"


def test_one_lease_per_group_at_a_time(store: Store, make_queue: Callable[..., Queue]) -> None:
    queue = make_queue("digests")
    schedule(store, queue, NewEvent(item_key="a1", group_key="ana", data={}))
    [first] = store.leases.claim(queue, worker="w1", limit=10)
    # A new due event of a group that holds a live lease waits for that lease to end.
    schedule(store, queue, NewEvent(item_key="a2", group_key="ana", data={}))
    assert store.leases.claim(queue, worker="w2", limit=10) == []
    store.leases.ack([first.lease_id])
    [second] = store.leases.claim(queue, worker="w2", limit=10)
    assert [e.item_key for e in second.events] == ["a2"]


def test_six_concurrent_claimers_never_split_or_duplicate_a_group(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    queue = make_queue("digests")
    groups, per_group = 60, 5
    schedule(
        store,
        queue,
        *(NewEvent(item_key=f"g{g}-e{i}", group_key=f"g{g}", data={}) for g in range(groups) for i in range(per_group)),
        *(NewEvent(item_key=f"solo{i}", data={}) for i in range(30)),
    )
    barrier = threading.Barrier(6)

    def claimer(n: int) -> list[Lease]:
        barrier.wait()
        mine: list[Lease] = []
        while leases := store.leases.claim(queue, worker=f"w{n}", limit=3, groups_first=n % 2 == 0):
            mine += leases
            store.leases.ack([lease.lease_id for lease in leases])
        return mine

    with ThreadPoolExecutor(6) as pool:
        all_leases = [lease for leases in pool.map(claimer, range(6)) for lease in leases]
    event_ids = Counter(e.id for lease in all_leases for e in lease.events)
    assert len(event_ids) == groups * per_group + 30 and set(event_ids.values()) == {1}
    group_leases = Counter(lease.group_key for lease in all_leases if lease.group_key)
    assert len(group_leases) == groups and set(group_leases.values()) == {1}  # never split
    assert all(len(lease.events) == per_group for lease in all_leases if lease.group_key)


def test_claims_of_a_queue_without_groups_ask_for_group_work_once_each(
    database_url: str, raw: psycopg.Connection[Any]
) -> None:
    """A claim returns whether its queue has group work (tickler_groups_due, migration 0068): the
    dispatcher asks nothing more before a group claim, so a queue without groups costs each claim
    one statement, in whichever order the round serves groups and events."""
    if not raw.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:  # type: ignore[index]
        pytest.skip("counting function calls (track_functions) takes a superuser")
    engine = create_engine(database_url, pool_size=1)

    @sa.event.listens_for(engine, "connect")
    def _count_calls(dbapi_connection: Any, record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET track_functions = 'pl'")
        dbapi_connection.commit()

    function = raw.execute("SELECT 'tickler_groups_due(text, timestamptz, boolean)'::regprocedure::oid").fetchone()[0]  # type: ignore[index]
    raw.execute("SELECT pg_stat_reset_single_function_counters(%s)", [function])

    def calls() -> int:
        raw.execute("SELECT pg_stat_clear_snapshot()")
        row = raw.execute("SELECT calls FROM pg_stat_user_functions WHERE funcid = %s", [function]).fetchone()
        return int(row[0]) if row else 0

    rounds = 6
    try:
        store = Store(engine)
        queue = store.queues.put("emails", QueueSettings(), Settings()).queue
        schedule(store, queue, *(NewEvent(item_key=f"k{i}", data={}) for i in range(5)))
        claimed = [len(store.leases.claim(queue, worker="w", limit=3, groups_first=n % 2 == 0)) for n in range(rounds)]
    finally:
        engine.dispose()  # its backend reports its function calls as it exits
    assert claimed == [3, 2, 0, 0, 0, 0]
    wait_until(lambda: calls() >= rounds, what=lambda: f"{calls()} calls of tickler_groups_due counted")
    assert calls() == rounds  # one per claim: no statement of its own before the group claims


def test_a_group_falling_due_among_ungrouped_events_is_claimed_by_the_next_groups_first_round(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    """The dispatcher's answer to "has this queue group work?" is the one its last claim returned
    (rounds alternate groups first and events first): a group that falls due after a claim that saw
    none is claimed by the first groups-first round after a claim that saw it, even when ungrouped
    events alone would fill every batch."""
    queue = make_queue("digests")
    schedule(store, queue, NewEvent(item_key="solo", data={}))
    assert [len(lease.events) for lease in store.leases.claim(queue, worker="w", limit=10)] == [1]  # no groups
    schedule(
        store,
        queue,
        NewEvent(item_key="a1", group_key="ana", data={}),
        NewEvent(item_key="a2", group_key="ana", data={}),
        *(NewEvent(item_key=f"e{i:02}", data={}) for i in range(20)),
    )
    rounds = [store.leases.claim(queue, worker="w", limit=5, groups_first=n % 2 == 0) for n in range(3)]
    # groups first, but the last claim saw none: 5 ungrouped (and sees the group); events first:
    # 5 ungrouped; groups first: the group, whole, then 4 ungrouped
    assert [[lease.group_key for lease in leases].count("ana") for leases in rounds] == [0, 0, 1]
    assert rounds[2][0].group_key == "ana" and sorted(e.item_key for e in rounds[2][0].events) == ["a1", "a2"]
    ungrouped = [e.item_key for leases in rounds for lease in leases if not lease.group_key for e in lease.events]
    assert ungrouped == [f"e{i:02}" for i in range(14)]


def test_stale_ack_after_expiry_and_reclaim_is_refused(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue, old = claim_one(store, make_queue, "slow", lease_seconds=10)
    later = db_now(raw) + timedelta(seconds=11)
    assert store.leases.expire(now=later) == {"emails": 1}
    [new] = store.leases.claim(queue, worker="fast", limit=1, now=later)
    with pytest.raises(StaleLease):
        store.leases.ack_one(old.lease_id, now=later)
    with pytest.raises(StaleLease):
        store.leases.nack(old.lease_id, error="late", now=later)
    with pytest.raises(StaleLease):
        store.leases.extend(old.lease_id, seconds=30, now=later)
    store.leases.ack_one(new.lease_id, now=later)
    event = store.events.get("emails", "k")
    assert (event.status, event.redeliver_count, event.dequeued_by) == ("delivered", 1, "fast")
    actions = [(t.action, t.actor) for t in store.events.timeline("emails", "k")]
    assert actions == [
        ("enqueued", "test"),
        ("claimed", "slow"),
        ("lease_expired", "tickler"),
        ("claimed", "fast"),
        ("delivered", "fast"),
    ]


def test_an_expired_lease_cannot_be_finished_even_before_it_is_reaped(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    _, lease = claim_one(store, make_queue, "w", lease_seconds=5)
    with pytest.raises(StaleLease):
        store.leases.ack_one(lease.lease_id, now=db_now(raw) + timedelta(seconds=6))
    assert store.events.get("emails", "k").status == "in_flight"


def test_nack_counts_redelivery_backs_off_and_ends_dead(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue(
        "emails", max_attempts=3, backoff_initial_seconds=10, backoff_multiplier=3, backoff_max_seconds=60
    )
    schedule(store, queue, NewEvent(item_key="k", data={}))
    now = db_now(raw)
    delays = []
    for attempt in range(1, 4):
        [lease] = store.leases.claim(queue, worker="w", limit=1, now=now)
        result = store.leases.nack(lease.lease_id, error=f"boom {attempt}", now=now)
        event = store.events.get("emails", "k", now=now)
        if attempt < 3:
            assert (result.retried, result.dead) == (1, 0)
            assert event.redeliver_count == attempt and event.last_error == f"boom {attempt}"
            delays.append((event.schedule_on - now).total_seconds())
            now = event.schedule_on
        else:
            assert (result.retried, result.dead) == (0, 1)
            assert (event.status, event.redeliver_count) == ("dead", 3)  # the last failure counts too
    # exponential with jitter: 10 * 3^n, scaled into [0.75, 1]
    assert 7.5 <= delays[0] <= 10 and 22.5 <= delays[1] <= 30
    entries = store.events.timeline("emails", "k")
    assert [t.action for t in entries] == ["enqueued", "claimed", "failed", "claimed", "failed", "claimed", "dead"]
    assert [t.details["attempt"] for t in entries if t.action in ("failed", "dead")] == [1, 2, 3]


def test_nack_retry_in_seconds_and_dead_flag(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails")
    schedule(store, queue, NewEvent(item_key="a", data={}), NewEvent(item_key="b", data={}))
    now = db_now(raw)
    a, b = store.leases.claim(queue, worker="w", limit=2, now=now)
    store.leases.nack(a.lease_id, error="later please", retry_in_seconds=120, now=now)
    assert store.events.get("emails", a.events[0].item_key).schedule_on == now + timedelta(seconds=120)
    store.leases.nack(b.lease_id, error="gone", dead=True, now=now)
    dead = store.events.get("emails", b.events[0].item_key)
    assert (dead.status, dead.redeliver_count) == ("dead", 1)  # a failed attempt like any other
    assert store.events.timeline("emails", dead.item_key)[-1].details["reason"] == "receiver said stop"


def test_extend_keeps_the_lease_alive(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", lease_seconds=5)
    schedule(store, queue, NewEvent(item_key="k", data={}))
    now = db_now(raw)
    [lease] = store.leases.claim(queue, worker="w", limit=1, now=now)
    expires = store.leases.extend(lease.lease_id, seconds=60, now=now + timedelta(seconds=4))
    assert expires == now + timedelta(seconds=64)
    assert store.leases.expire(now=now + timedelta(seconds=30)) == {}
    store.leases.ack_one(lease.lease_id, now=now + timedelta(seconds=30))


def test_release_makes_events_claimable_at_once_without_counting(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    queue, lease = claim_one(store, make_queue, "w1", lease_seconds=300)
    assert store.leases.release([lease.lease_id], actor="w1") == 1
    [again] = store.leases.claim(queue, worker="w2", limit=1)
    assert again.events[0].redeliver_count == 0
    assert [t.action for t in store.events.timeline("emails", "k")] == ["enqueued", "claimed", "released", "claimed"]


def test_lease_expiry_on_the_last_attempt_ends_dead(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    claim_one(store, make_queue, "w", lease_seconds=5, max_attempts=1)
    store.leases.expire(now=db_now(raw) + timedelta(seconds=6))
    event = store.events.get("emails", "k")
    assert (event.status, event.dequeued_by, event.redeliver_count) == ("dead", "tickler", 1)
    entries = store.events.timeline("emails", "k")
    assert [t.action for t in entries][-2:] == ["lease_expired", "dead"]
    assert entries[-1].details["attempts"] == 1
