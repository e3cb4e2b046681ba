"""Fair share without a per-key cap (SPEC §10): one autocommit statement, no flow lock
(claim_events with :fair, tickler_claim_events()). Concurrent claimers never take an event twice and
each claim hands out its keys round robin; a key holding most due events fills the batch; a
level is left for a lower one only when it has nothing more to give."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tests.test_priority import claimed_keys, db_now, drain
from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.models import Lease, NewEvent, Queue
from tickler.scheduler.store import Store


def keys_of(item_keys: list[str]) -> list[str]:
    return [k.split("-")[0] for k in item_keys]


def rounds(keys: list[str]) -> list[int]:
    """Each handed-out event's round: how many events of its key the claim handed out up to it."""
    seen: Counter[str] = Counter()
    out = []
    for key in keys:
        seen[key] += 1
        out.append(seen[key])
    return out


def test_a_fair_claim_without_a_cap_takes_no_flow_lock(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], database_url: str
) -> None:
    queue = make_queue("emails", fair_share=True)
    assert not queue.flow_limited and queue.claim_path == "fair"
    now = db_now(raw)
    store.events.schedule_batch(
        queue, [NewEvent(f"{k}-{i}", {}, fairness_key=k, schedule_on=now) for k in "ab" for i in range(2)], actor="t"
    )
    claimed: list[Lease] = []
    with psycopg.connect(libpq_url(database_url)) as holder:
        # another claimer of a limited queue would hold this lock for its whole transaction
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('tickler_flow/' || 'emails', 0))")
        worker = threading.Thread(target=lambda: claimed.extend(store.leases.claim(queue, worker="w", limit=4)))
        worker.start()
        try:
            wait_until(lambda: not worker.is_alive(), 30, what="a fair claim waiting for the flow lock")
        finally:
            holder.rollback()
            worker.join(timeout=30)
    assert keys_of(claimed_keys(claimed)) == ["a", "b", "a", "b"]


def test_concurrent_fair_claimers_never_take_an_event_twice_and_each_claim_is_round_robin(
    make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], database_url: str, store: Store
) -> None:
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    keys, per_key, batch = 40, 10, 8
    store.events.schedule_batch(
        queue,
        [
            NewEvent(f"t{k:02}-{i}", {}, fairness_key=f"t{k:02}", schedule_on=now - timedelta(seconds=per_key - i))
            for k in range(keys)
            for i in range(per_key)
        ],
        actor="test",
    )
    claims: list[list[str]] = []  # item keys of each claim, in the order handed out, by completion
    lock = threading.Lock()
    failures: list[BaseException] = []

    def claimer(name: str) -> None:
        own = Store(create_engine(database_url, pool_size=2))  # connections of its own
        try:
            while leases := own.leases.claim(queue, worker=name, limit=batch):
                with lock:
                    claims.append(claimed_keys(leases))
        except BaseException as error:  # reported by the test thread
            failures.append(error)
        finally:
            own.engine.dispose()

    threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures and not any(thread.is_alive() for thread in threads)
    taken = [k for claim in claims for k in claim]
    assert len(taken) == len(set(taken)) == keys * per_key  # each event once, none left
    leases = raw.execute(
        "SELECT count(*), count(DISTINCT lease_id), count(DISTINCT claimed_by) FROM tickler_event"
        " WHERE queue = 'emails' AND lease_id IS NOT NULL"
    ).fetchone()
    assert leases is not None and leases[0] == leases[1] == keys * per_key and leases[2] >= 2
    for claim in claims:
        # round robin within each claim: round r of every key it serves before round r + 1
        assert rounds(keys_of(claim)) == sorted(rounds(keys_of(claim))), claim
        # and each key's events in due order
        for key in set(keys_of(claim)):
            mine = [int(k.split("-")[1]) for k in claim if k.startswith(f"{key}-")]
            assert mine == sorted(mine), claim
    # while every key still has due events, a claim takes one event of each of `batch` keys
    # (the first claims to complete: fewer than a third of the events were taken by then)
    for claim in claims[:12]:
        assert len(claim) == batch and len(set(keys_of(claim))) == batch, claims[:12]


def test_a_claim_that_finds_other_claims_holding_keys_still_hands_out_round_robin(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], database_url: str
) -> None:
    """Another claim holds (locks, not yet leased) every event of keys b..h: the first stretch of
    eight keys gives only a's events, a takes what they leave, and the next stretch serves i..l.
    The claim still hands out round 1 of every key it served before any key's round 2."""
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    store.events.schedule_batch(
        queue,
        [
            NewEvent(f"{k}-{i}", {}, fairness_key=k, schedule_on=now - timedelta(seconds=4 - i))
            for k in "abcdefgh"
            for i in range(4)
        ]
        + [NewEvent(f"{k}-0", {}, fairness_key=k, schedule_on=now) for k in "ijkl"],
        actor="test",
    )
    with psycopg.connect(libpq_url(database_url)) as holder:
        holder.execute(
            "SELECT id FROM tickler_event WHERE queue = 'emails' AND fairness_key BETWEEN 'b' AND 'h' FOR UPDATE"
        )
        claimed = claimed_keys(store.leases.claim(queue, worker="w", limit=8, now=now))
        holder.rollback()
    assert claimed == ["a-0", "i-0", "j-0", "k-0", "l-0", "a-1", "a-2", "a-3"]


def test_one_key_holding_most_due_events_fills_the_batch_after_one_round(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    store.events.schedule_batch(
        queue,
        [NewEvent(f"big-{i:03}", {}, fairness_key="big", schedule_on=now - timedelta(minutes=1)) for i in range(300)]
        + [NewEvent(f"s{n}-0", {}, fairness_key=f"s{n}", schedule_on=now) for n in range(5)],
        actor="test",
    )
    first = keys_of(claimed_keys(store.leases.claim(queue, worker="w", limit=100, now=now)))
    assert len(first) == 100  # not 6 keys x a share of 17: the big key takes what the others leave
    assert sorted(first[:6]) == ["big", "s0", "s1", "s2", "s3", "s4"] and first[6:] == ["big"] * 94
    assert keys_of(claimed_keys(store.leases.claim(queue, worker="w", limit=100, now=now))) == ["big"] * 100


def test_a_level_is_left_for_a_lower_one_only_when_it_has_nothing_more_to_give(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    due = now - timedelta(seconds=1)
    store.events.schedule_batch(
        queue,
        [NewEvent(f"a-{i}", {}, fairness_key="a", priority=5, schedule_on=due) for i in range(10)]
        + [NewEvent("b-0", {}, fairness_key="b", priority=5, schedule_on=due)]
        + [NewEvent(f"c-{i}", {}, fairness_key="c", schedule_on=due) for i in range(10)],
        actor="test",
    )
    batches = [keys_of(b) for b in drain(store, queue, 8, now)]
    assert batches[0] == ["a", "b", "a", "a", "a", "a", "a", "a"]  # not a share of 4 for a, then c
    assert batches[1] == ["a", "a", "a", "c", "c", "c", "c", "c"]
    assert batches[2] == ["c"] * 5


@pytest.mark.parametrize("fair_share", [True, False])
def test_the_plain_and_the_fair_fast_claims_refuse_each_others_queues(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], fair_share: bool
) -> None:
    """A caller with stale settings claims nothing through the wrong statement: the plain claim
    would take a fair queue's backlog unfairly; the fair one takes nothing from a capped queue."""
    stale = make_queue("emails", fair_share=fair_share)
    make_queue("emails", fair_share=True, max_in_flight_per_key=1 if fair_share else None)
    store.events.schedule_batch(stale, [NewEvent("a-0", {}, fairness_key="a", schedule_on=db_now(raw))], actor="t")
    assert store.leases.claim(stale, worker="w", limit=5) == []


def test_a_fair_queue_without_a_cap_claims_its_groups_on_the_fast_path(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """Groups are not interleaved round robin (docs/architecture.md): the group claim serves a fair
    queue without a cap without the flow lock too, next to the round-robin claim."""
    queue = make_queue("emails", fair_share=True)
    now = db_now(raw)
    store.events.schedule_batch(
        queue,
        [NewEvent(f"g-{i}", {}, group_key="g", fairness_key="a", schedule_on=now) for i in range(2)]
        + [
            NewEvent("a-0", {}, fairness_key="a", schedule_on=now),
            NewEvent("b-0", {}, fairness_key="b", schedule_on=now),
        ],
        actor="test",
    )
    leases = store.leases.claim(queue, worker="w", limit=5, now=now)
    assert sorted((lease.group_key, len(lease.events)) for lease in leases if lease.group_key) == [("g", 2)]
    assert sorted(claimed_keys([lease for lease in leases if not lease.group_key])) == ["a-0", "b-0"]


def test_a_capped_fair_claim_says_whether_the_queue_has_group_work(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """Under the flow lock as without it, the ungrouped claim tells whether the queue has group work
    (claim_events_fair returns groups_due): a group claim runs only when the last ungrouped claim
    saw some, so a group that became due after a claim that saw none is served from the next one."""
    queue = make_queue("emails", max_in_flight_per_key=5)
    now = db_now(raw)
    store.events.schedule_batch(queue, [NewEvent("a-0", {}, fairness_key="a", schedule_on=now)], actor="test")
    assert claimed_keys(store.leases.claim(queue, worker="w", limit=5, now=now)) == ["a-0"]
    store.events.schedule_batch(
        queue,
        [NewEvent(f"g-{i}", {}, group_key="g", fairness_key="b", schedule_on=now) for i in range(2)]
        + [NewEvent("a-1", {}, fairness_key="a", schedule_on=now)],
        actor="test",
    )
    # groups first, but the last claim saw no group work: the events, which see the group
    second = store.leases.claim(queue, worker="w", limit=5, now=now, groups_first=True)
    assert claimed_keys(second) == ["a-1"]
    third = store.leases.claim(queue, worker="w", limit=5, now=now, groups_first=True)
    assert [(lease.group_key, len(lease.events)) for lease in third] == [("g", 2)]
