"""Priority and fair share (issue #22, SPEC §10): the four rows of the issue's table.

1. claim latency with priorities in use (3 levels) at many pending future events vs 10,000;
2. fair share: one key with a large due backlog and 1,000 keys with one due event each — the p99
   lateness of the small keys' events, and the big key's drain rate against the same queue
   without fair share;
3. claim throughput with fair share on, 10,000 keys, batch 100, against the same queue without;
4. max_in_flight_per_key = 2 with 4 claimers and 100 keys: the most live leases of one key,
   sampled every 10 ms.

Claims run in this process through the store (claim + ack, as a pull consumer or the dispatcher
does), so the rows measure the claim statements, not HTTP or delivery. Events are loaded with
plain INSERT ... SELECT (the setup is not what is measured).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from bench.harness import QUEUE, Context, Row, make_queue, median, percentile, say, store_for
from tickler.scheduler.models import Queue
from tickler.scheduler.store import Store

BATCH = 100


def _load(url: str, sql: str, params: dict[str, Any]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql, params)
        conn.execute("ANALYZE tickler_event")


def _insert(url: str, *, n: int, due: str, priority: str = "0", key: str = "''", prefix: str = "e") -> None:
    """n events of the bench queue: due at the SQL expression `due`, with these priority and
    fairness_key expressions of g (1..n)."""
    _load(
        url,
        f"""INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_by, max_attempts, priority,
                                       fairness_key)
            SELECT %(queue)s, %(prefix)s || g, {due}, '{{}}', 'bench', 10, {priority}, {key}
            FROM generate_series(1, %(n)s) AS g""",
        {"queue": QUEUE, "n": n, "prefix": prefix},
    )


def _queue(store: Store) -> Queue:
    return store.queues.get(QUEUE)


def _claim_and_ack(store: Store, queue: Queue, limit: int = BATCH) -> int:
    claim = store.leases.claim_within_limits(queue, worker="bench", limit=limit)
    if claim.leases:
        store.leases.ack([lease.lease_id for lease in claim.leases])
    return sum(len(lease.events) for lease in claim.leases)


def claim_latency(ctx: Context, *, levels: bool = True) -> Row:
    """Median latency of a claim of 100 due events (3 priority levels, or all at 0), with `big`
    pending future events (likewise), against the same with 10,000."""
    big = ctx.size(100_000, 1_000_000)
    priority = "mod(g, 3) - 1" if levels else "0"
    latencies: dict[int, float] = {}
    for future in (10_000, big):
        with ctx.database() as url:
            make_queue(url)
            _insert(url, n=future, due="now() + interval '1 day'", priority=priority, prefix="f")
            store = store_for(url)
            try:
                runs = []
                for _ in range(ctx.repeats):
                    _insert(url, n=2_000, due="now() - interval '1 second'", priority=priority, prefix="d")
                    queue = _queue(store)
                    took = []
                    while True:
                        start = time.perf_counter()
                        claim = store.leases.claim_within_limits(queue, worker="bench", limit=BATCH)
                        took.append(time.perf_counter() - start)
                        if not claim.leases:
                            break
                        store.leases.ack([lease.lease_id for lease in claim.leases])
                    runs.append(median(took[:-1]) * 1000)
                latencies[future] = median(runs)
            finally:
                store.engine.dispose()
    say(f"priority claim latency: {latencies}")
    ratio = latencies[big] / latencies[10_000]
    return Row(
        f"priority: claim latency (batch {BATCH}, {'3 levels' if levels else 'all at priority 0'}) "
        f"at {big:,} pending future events vs 10,000",
        latencies[big],
        latencies[10_000],
        "ms",
        "≤ 1.5x of 10,000",
        ratio <= 1.5,
        note=f"ratio {ratio:.2f}",
    )


def fair_lateness(ctx: Context) -> list[Row]:
    """One key with a due backlog, 1,000 keys with one due event each (due after the backlog):
    the small events' p99 lateness with fair share, and the big key's drain rate with fair share
    against the queue's rate without it."""
    backlog = ctx.size(20_000, 1_000_000)
    window = 5.0  # seconds of draining measured for the rates
    rates: dict[bool, float] = {}
    lateness: list[float] = []
    for fair in (False, True):
        with ctx.database() as url:
            make_queue(url, fair_share=fair)
            _insert(url, n=backlog, due="now() - interval '1 minute'", key="'big'", prefix="big")
            _insert(url, n=1_000, due="now()", key="'small-' || g", prefix="small")
            store = store_for(url)
            try:
                queue = _queue(store)
                big_done = 0
                with psycopg.connect(url, autocommit=True) as conn:  # lateness counts from here, not the load
                    row = conn.execute("SELECT now()").fetchone()
                    assert row is not None
                    claims_from = row[0]
                start = time.perf_counter()
                while time.perf_counter() - start < window:
                    if not _claim_and_ack(store, queue):
                        break  # drained before the window ended: the rate is over the time it took
                elapsed = time.perf_counter() - start
                with psycopg.connect(url, autocommit=True) as conn:
                    rows = conn.execute(
                        """SELECT fairness_key = 'big', extract(epoch FROM claimed_on - greatest(schedule_on, %s))
                           FROM tickler_event_history WHERE queue = %s""",
                        (claims_from, QUEUE),
                    ).fetchall()
                big_done = sum(1 for is_big, _ in rows if is_big)
                rates[fair] = big_done / elapsed
                if fair:
                    lateness = [float(late) for is_big, late in rows if not is_big]
                    if len(lateness) < 1_000:  # a small event not claimed in the window: at least that late
                        lateness += [window] * (1_000 - len(lateness))
            finally:
                store.engine.dispose()
    p99 = percentile(lateness, 99)
    share = rates[True] / rates[False] if rates[False] else 0.0
    say(f"fair lateness p99 {p99:.3f}s, big key {rates[True]:,.0f}/s fair vs {rates[False]:,.0f}/s")
    return [
        Row(
            f"fair share: p99 lateness of 1,000 small keys' events behind one key's {backlog:,} due",
            p99,
            None,
            "s",
            "≤ 1 s",
            p99 <= 1.0,
        ),
        Row(
            "fair share: the big key's drain rate vs the queue without fair share",
            rates[True],
            rates[False],
            "events/s",
            "≥ 80%",
            share >= 0.8,
            note=f"{share:.0%}",
        ),
    ]


def fair_throughput(ctx: Context) -> Row:
    """Drain 10,000 keys, 5 due events each, batch 100, with and without fair share."""
    keys, per_key = 10_000, ctx.size(1, 5)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for fair in (False, True):
        for _ in range(ctx.repeats):
            with ctx.database() as url:
                make_queue(url, fair_share=fair)
                _insert(url, n=keys * per_key, due="now() - interval '1 second'", key=f"'t' || mod(g, {keys})")
                store = store_for(url)
                try:
                    queue = _queue(store)
                    start = time.perf_counter()
                    done = 0
                    while taken := _claim_and_ack(store, queue):
                        done += taken
                    rates[fair].append(done / (time.perf_counter() - start))
                finally:
                    store.engine.dispose()
    t, b = median(rates[True]), median(rates[False])
    say(f"fair throughput {t:,.0f}/s vs {b:,.0f}/s")
    return Row(
        f"fair share: claim+ack throughput, {keys:,} keys, batch {BATCH}, vs without fair share",
        t,
        b,
        "events/s",
        "≥ 0.7x without",
        t >= 0.7 * b,
        runs=rates[True],
        baseline_runs=rates[False],
    )


def per_key_cap(ctx: Context) -> Row:
    """4 claimers (threads, each its own connections) claim up to 100 leases and hold them ~20 ms
    (uncapped, a claim would take several events of a key); a sampler reads the most live leases
    of one key every 10 ms."""
    keys, per_key, cap = 100, ctx.size(5, 20), 2
    with ctx.database() as url:
        make_queue(url, max_in_flight_per_key=cap)
        _insert(url, n=keys * per_key, due="now() - interval '1 second'", key=f"'t' || mod(g, {keys})")
        stop = threading.Event()
        worst = 0
        samples = 0
        total = keys * per_key
        acked: list[int] = []
        lock = threading.Lock()

        def claimer(name: str) -> None:
            store = store_for(url, pool_size=2)
            try:
                queue = _queue(store)
                while not stop.is_set():
                    with lock:
                        if sum(acked) >= total:
                            return
                    claim = store.leases.claim_within_limits(queue, worker=name, limit=BATCH)
                    if not claim.leases:
                        time.sleep(claim.room_in or 0.01)  # keys at their cap: leases end elsewhere
                        continue
                    time.sleep(0.02)  # the handler's work
                    store.leases.ack([lease.lease_id for lease in claim.leases])
                    with lock:
                        acked.append(sum(len(lease.events) for lease in claim.leases))
            finally:
                store.engine.dispose()

        threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        with psycopg.connect(url, autocommit=True) as conn:
            while any(thread.is_alive() for thread in threads):
                row = conn.execute(
                    """SELECT coalesce(max(n), 0) FROM (
                           SELECT count(DISTINCT lease_id) AS n FROM tickler_event
                           WHERE dequeued_on IS NULL AND lease_id IS NOT NULL AND lease_expires_on > now()
                           GROUP BY fairness_key) AS live"""
                ).fetchone()
                worst = max(worst, int(row[0]) if row else 0)
                samples += 1
                time.sleep(0.01)
        stop.set()
        for thread in threads:
            thread.join()
    say(f"per-key cap: most live leases of one key {worst} in {samples} samples")
    return Row(
        f"max_in_flight_per_key = {cap}, 4 claimers, {keys} keys: most live leases of one key",
        float(worst),
        None,
        "leases",
        f"never more than {cap}",
        worst <= cap,
        note=f"{samples} samples every 10 ms",
    )


def run(ctx: Context) -> list[Row]:
    return [
        claim_latency(ctx),
        claim_latency(ctx, levels=False),  # the same measure without priorities: what "as without" means here
        *fair_lateness(ctx),
        fair_throughput(ctx),
        per_key_cap(ctx),
    ]
