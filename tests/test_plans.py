"""The hot queries stay on their indexes, also on a table with no statistics yet (a fresh
install) and after a large load: a plan that scans open events would slow every claim."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests import pg
from tests.helpers import plan_nodes
from tickler.config import Settings
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql, file_queries
from tickler.scheduler.store import QueueSettings, Store


def plan(raw: psycopg.Connection[Any], name: str, params: dict[str, Any], source: dict[str, str] | None = None) -> str:
    """EXPLAIN (FORMAT JSON) of a named query (driver_sql, or of `source`: a file's file_queries),
    with its params bound as the store binds them (server-side), as text."""
    text = source[name] if source is not None else driver_sql(name)
    rows = raw.execute(f"EXPLAIN (FORMAT JSON) {text}", params).fetchone()
    assert rows is not None
    return json.dumps(rows[0])


def scanned(plan_text: str) -> set[str]:
    """The tables a plan reads by sequential scan. The queue table (a few rows) may be: the claims'
    guard reads one queue's settings, and the planner rightly scans a table of one page. So may
    the lease table (migration 0060): it holds the events in flight only, and has no index but its
    primary key (lease id), so that a claim writes one index entry for its lease."""
    nodes = plan_nodes(json.loads(plan_text))
    read_whole = {node.get("Relation Name", "?") for node in nodes if node.get("Node Type") == "Seq Scan"}
    return read_whole - {"tickler_queue", "tickler_lease"}


def populated(raw: psycopg.Connection[Any]) -> set[str]:
    """The open events' table and the day partitions of history and timeline that hold rows (a
    sequential scan of an empty day, one of the days ahead, is the planner's fair choice)."""
    found = raw.execute(
        "SELECT DISTINCT tableoid::regclass::text FROM tickler_event_history"
        " UNION SELECT DISTINCT tableoid::regclass::text FROM tickler_timeline"
    )
    return {"tickler_event"} | {row[0] for row in found}


# The claim itself (PL/pgSQL), not the previous release's call of it (a SQL function of the same name).
CLAIM_FUNCTION = "SELECT {} FROM pg_proc WHERE proname = 'tickler_claim_events' AND pronargs = 7"


def claim_plan(raw: psycopg.Connection[Any], *, analyze: bool = False) -> dict[str, Any]:
    """EXPLAIN (FORMAT JSON) of the plain claim's statement as tickler_claim_events() runs it: its
    text from the function, prepared, on a generic plan (the function's SET clause), for queue
    'emails', limit 10. `analyze`: run it (it claims) and count buffers."""
    row = raw.execute(CLAIM_FUNCTION.format("prosrc")).fetchone()
    assert row is not None
    source: str = row[0]
    statement = source[source.index("RETURN QUERY") + len("RETURN QUERY") : source.rindex(";")]
    for number, name in enumerate(
        ("p_queue", "p_worker", "p_limit", "p_lease_seconds", "p_now", "p_flow", "p_fair"), 1
    ):
        statement = re.sub(rf"\b{name}\b", f"${number}", statement)
    raw.execute("DEALLOCATE ALL")
    raw.execute(f"PREPARE claim AS {statement}")
    raw.execute("SET plan_cache_mode = force_generic_plan")
    try:
        options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
        found = raw.execute(f"EXPLAIN ({options}) EXECUTE claim('emails', 'w', 10, 30, NULL, false, false)").fetchone()
    finally:
        raw.execute("RESET plan_cache_mode")
    assert found is not None
    return dict(found[0][0])


@pytest.fixture
def fresh_install(admin_url: str) -> Iterator[tuple[Store, psycopg.Connection[Any]]]:
    """A database of its own, just migrated: no statistics at all. (The suite's shared database
    keeps the statistics of earlier tests across TRUNCATE: a table analysed when every event was
    finished makes the planner believe no event is open, which is no fresh install.) Autovacuum
    is off for the event table, so an analyse cannot land in the middle of the load."""
    with pg.migrated_database(admin_url, "tickler_plans", pool_size=2) as (_, engine, raw):
        raw.execute("ALTER TABLE tickler_event SET (autovacuum_enabled = off)")
        yield Store(engine), raw


@pytest.mark.parametrize("analysed", [False, True])
def test_claims_and_acks_use_their_indexes(
    fresh_install: tuple[Store, psycopg.Connection[Any]], analysed: bool
) -> None:
    store, raw = fresh_install
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    for start in range(0, 20_000, 5_000):
        store.events.schedule_batch(
            queue,
            [NewEvent(item_key=f"k{i}", data={}, delay_seconds=3600) for i in range(start, start + 5_000)],
            actor="load",
        )
    store.events.schedule_batch(queue, [NewEvent(item_key=f"due{i}", data={}) for i in range(100)], actor="load")
    leases = store.leases.claim(queue, worker="w", limit=50)
    if analysed:
        raw.execute("ANALYZE tickler_event")
    claim = json.dumps(claim_plan(raw))
    assert "tickler_event_claimable" in claim and not scanned(claim), claim
    ack = plan(
        raw,
        "ack_leases",
        {
            "lease_ids": [lease.lease_id for lease in leases] + [str(uuid.uuid4())],
            "queues": None,
            "now": None,
            "trace_ids": None,
        },
    )
    # The leases' events: found in the lease table (a page or two here: read whole), then by the
    # events' primary key, never by a scan of the events.
    assert "tickler_event_pkey" in ack and not scanned(ack), ack
    fate = plan(raw, "lease_fate", {"lease_id": leases[0].lease_id})
    assert not scanned(fate), fate
    groups = plan(
        raw, "lock_due_groups", {"queue": "emails", "limit": 10, "scan": 500, "now": None, "flow": False, "cap": None}
    )
    assert "tickler_event_claimable_group" in groups and not scanned(groups)
    grouped = plan(
        raw,
        "claim_groups",
        {"queue": "emails", "groups": ["g1", "g2"], "worker": "w", "lease_seconds": 30, "now": None},
    )
    assert not scanned(grouped), grouped  # the lease table (in-flight events only) may be read whole
    # A key's history is read through the timeline's one B-tree (tickler_timeline_key, in each day's
    # partition), never by scan of a day that holds rows.
    timeline = plan(raw, "timeline", {"queue": "emails", "item_key": "k7"})
    assert_lease_table_read_by_key(store, raw, queue)
    assert "_queue_item_key_id_idx" in timeline and not scanned(timeline) & populated(raw), timeline
    # A capped claim's room and the queue gauges count the queue's live leases in the lease table
    # (the events in flight only), never by a scan of the events.
    room = plan(raw, "flow_room", {"queue": "emails", "now": None})
    live = plan(raw, "queue_live_counts", {"queue": "emails", "now": None})
    for counted in (room, live):
        assert '"tickler_lease"' in counted
        assert not scanned(counted), counted


def assert_lease_table_read_by_key(store: Store, raw: psycopg.Connection[Any], queue: Any) -> None:
    """With many events in flight, ack, nack, extend and the 409's lease_status find a lease on
    the lease table's primary key, analysed or not (without statistics the planner sizes the
    table from its pages)."""
    raw.execute("UPDATE tickler_event SET schedule_on = now() - interval '1 second' WHERE item_key LIKE 'k1%'")
    leases = store.leases.claim(queue, worker="w", limit=5_000)
    assert len(leases) > 1_000
    lease_ids = [lease.lease_id for lease in leases[:3]]
    ack = plan(raw, "ack_leases", {"lease_ids": lease_ids, "queues": None, "now": None, "trace_ids": None})
    fail = plan(
        raw,
        "fail_lease",
        {
            "lease_id": lease_ids[0],
            "now": None,
            "dead": False,
            "retry_in_seconds": None,
            "error": "x",
            "trace_id": None,
        },
    )
    extend = plan(raw, "extend_lease", {"lease_id": lease_ids[0], "now": None, "seconds": 30})
    fate = plan(raw, "lease_fate", {"lease_id": lease_ids[0]})
    for name, text in {"ack": ack, "fail": fail, "extend": extend, "fate": fate}.items():
        assert "tickler_lease_pkey" in text and '"Seq Scan"' not in text, (name, text)


def scans_of_events(plan_text: str) -> list[tuple[str, str | None, float]]:
    """Each read of tickler_event in a plan: (node type, index, rows the planner expects)."""
    return [
        (node["Node Type"], node.get("Index Name"), float(node["Plan Rows"]))
        for node in plan_nodes(json.loads(plan_text))
        if node.get("Relation Name") == "tickler_event"
    ]


def test_due_counts_read_only_the_due_range_of_a_large_future_backlog(
    fresh_install: tuple[Store, psycopg.Connection[Any]],
) -> None:
    """The counts of the queue endpoint, /metrics and the dashboard at a backlog of future events
    (the 10,000,000-event benchmark's state, scaled down): the planner must know from the clock's
    value that only the due few qualify. Taken from a CTE, the clock was an unknown priced at a
    third of the table, and at 10M events the due count read all of them (1.9 s per request)."""
    store, raw = fresh_install
    store.queues.put("emails", QueueSettings(), Settings())
    raw.execute(
        "INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)"
        " SELECT 'emails', 'future:' || g, now() + interval '1 day' + g * interval '1 millisecond',"
        " '{}', now(), 'load', 3 FROM generate_series(1, 30000) AS g"
    )
    raw.execute("ANALYZE tickler_event")
    queue = store.queues.get("emails")
    store.events.schedule_batch(queue, [NewEvent(item_key=f"due{i}", data={}) for i in range(100)], actor="load")
    store.leases.claim(queue, worker="w", limit=10)
    plans = {
        "queue_live_counts": plan(raw, "queue_live_counts", {"queue": "emails", "now": None}),
        "queue_gauges": plan(raw, "queue_gauges", {"names": None, "now": None}),
        "overview": plan(
            raw, "overview", {"names": None, "now": None}, file_queries("tickler.scheduler.store", "dashboard.sql")
        ),
    }
    for name, text in plans.items():
        scans = scans_of_events(text)
        assert scans, name
        # a read the planner expects to return more than 1 % of the table is not a read of the due few
        assert all(kind != "Seq Scan" and rows <= 300 for kind, _, rows in scans), (name, scans)
    assert store.queues.counts("emails")["due"] == 90


def test_the_claim_on_its_generic_plan_reads_the_first_due_events(
    fresh_install: tuple[Store, psycopg.Connection[Any]],
) -> None:
    """The plain claim is tickler_claim_events(), whose statement runs on a
    generic plan, made once for any limit and clock: with a backlog of 20,000 due events and
    20,000 future ones it must still read the claimable index in order from the first due event,
    and stop after the limit. The function's statement, prepared on a generic plan, is explained."""
    store, raw = fresh_install
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    for start, delay in ((0, 0), (20_000, 3600)):
        for first in range(start, start + 20_000, 5_000):
            store.events.schedule_batch(
                queue,
                [NewEvent(item_key=f"k{i}", data={}, delay_seconds=delay) for i in range(first, first + 5_000)],
                actor="load",
            )
    raw.execute("ANALYZE tickler_event")
    store.leases.claim(queue, worker="w", limit=50)  # through the function
    top = claim_plan(raw, analyze=True)
    plan_text = json.dumps(top)
    assert "tickler_event_claimable" in plan_text and not scanned(plan_text), plan_text
    assert top["Plan"]["Actual Rows"] == 10
    assert top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"] < 1_000, plan_text
    settings = raw.execute(CLAIM_FUNCTION.format("proconfig")).fetchone()
    assert settings is not None and "plan_cache_mode=force_generic_plan" in settings[0]


def schedule_keyed_backlog(store: Store, queue: Queue) -> None:
    """20,000 future events in 3 priority levels (-1, 0, 1) over 1,000 fairness keys, and 150 due
    over 50 of those keys."""
    for start in range(0, 20_000, 5_000):
        store.events.schedule_batch(
            queue,
            [
                NewEvent(f"k{i}", {}, delay_seconds=3600, priority=(i % 3) - 1, fairness_key=f"t{i % 1000}")
                for i in range(start, start + 5_000)
            ],
            actor="load",
        )
    store.events.schedule_batch(
        queue,
        [NewEvent(f"due{i}", {}, priority=(i % 3) - 1, fairness_key=f"t{i % 50}") for i in range(150)],
        actor="load",
    )


@pytest.mark.parametrize("analysed", [False, True])
def test_the_fair_claim_without_a_cap_probes_keys_on_its_indexes(
    fresh_install: tuple[Store, psycopg.Connection[Any]], analysed: bool
) -> None:
    """The fair claim without a cap (claim_events with :fair: one autocommit statement) at 20,000 future
    events in 3 priority levels over 1,000 fairness keys, 150 due over 50 keys: the statement and
    the pick it calls read tickler_event through its indexes only (no sequential scan, also
    without statistics), one probe per key looked at, never the future events one by one."""
    store, raw = fresh_install
    queue = store.queues.put("emails", QueueSettings(fair_share=True), Settings()).queue
    schedule_keyed_backlog(store, queue)
    if analysed:
        raw.execute("ANALYZE tickler_event")
    params = {"queue": "emails", "worker": "w", "limit": 100, "lease_seconds": 30, "now": None, "flow": False}
    params["fair"] = True
    statement = plan(raw, "claim_events", params)
    assert not scanned(statement), statement
    # The pick is PL/pgSQL: what it read is in this transaction's statistics.
    text = driver_sql("claim_events")
    raw.execute("BEGIN")
    try:
        before = raw.execute(
            "SELECT pg_stat_get_xact_tuples_returned('tickler_event_claimable_fair'::regclass)"
        ).fetchone()
        claimed = raw.execute(text, params).fetchall()
        seq = raw.execute("SELECT pg_stat_get_xact_numscans('tickler_event'::regclass)").fetchone()
        fair = raw.execute(
            "SELECT pg_stat_get_xact_tuples_returned('tickler_event_claimable_fair'::regclass)"
        ).fetchone()
        probes = raw.execute("SELECT pg_stat_get_xact_numscans('tickler_event_claimable_fair'::regclass)").fetchone()
    finally:
        raw.execute("ROLLBACK")  # the events stay as they were
    assert len(claimed) == 100
    assert seq is not None and seq[0] == 0  # sequential scans of the events' table
    # Each level holds 1,000 keys, 50 of them with due events: the claim looks at 10 x the batch
    # keys of a level at most (one probe each), reads each served key's due events (one range), and
    # so takes two levels; not the 20,000 events.
    assert probes is not None and probes[0] <= 2 * (1_000 + 50) + 10, probes
    assert fair is not None and before is not None and fair[0] - before[0] < 3_000, (before, fair)
