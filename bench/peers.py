"""tickler, the peers (pgqueuer; awa-pg for the batch) and the plain-SQL baseline doing the same work
in the same run.

Each side is driven through its public interface: tickler's store and Worker, pgqueuer's
SyncQueries and QueueManager (bench/pgq.py), awa's Client (bench/awa_peer.py), the baseline's SQL
(bench/baseline.py). tickler and the baseline share a fresh database (one after the other); each
peer gets a fresh database of its own with its schema installed by its own installer. Without a
peer installed (`pip install -e '.[bench]'`), its cells say "—".

Every event has the same shape on every side, the one a keyed, grouped producer writes: its own
key (a dedupe key for pgqueuer, the arguments for awa), a group out of GROUPS (awa's ordering key;
pgqueuer has no groups), the payload {"i": n, "pad": <64 characters>}, tickler's on_conflict
`ignore` (every key is new, so each side writes every event).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import awa_peer, baseline, pgq
from bench.cpu import CpuMeter, CpuUse, SelfCpu
from bench.drain import baseline_fill, padded, tickler_drain
from bench.harness import QUEUE, Context, Row, clock_offset, make_queue, median, median_cpu, percentile, say, store_for
from bench.lateness import LEAD, baseline_lateness, produce, tickler_lateness
from bench.procs import WorkerSpec, baseline_drain, race, tickler_workers

_round = [0]
GROUPS = 1_000


def _group(i: int) -> str:
    return f"g{i % GROUPS}"


def _prefix() -> str:
    _round[0] += 1
    return f"p{_round[0]}-"


# -- enqueue, one event per transaction, in-process, N client processes -------------------------------


def _enqueue_client(side: str, url: str, prefix: str, count: int, go: Any, out: Any) -> None:
    from tickler.scheduler.models import NewEvent
    from tickler.scheduler.states import OnConflict

    if side == "tickler":
        store = store_for(url, pool_size=1)
        queue = store.queues.get(QUEUE)
        with store.engine.connect() as conn:  # warm the pool: its one connection's backend is measured
            backend = int(conn.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
        go.wait()
        cpu = SelfCpu(backend)
        for i in range(count):
            event = NewEvent(item_key=f"{prefix}{i}", data=padded(i), delay_seconds=3600, group_key=_group(i))
            store.events.schedule(queue, event, actor="bench", on_conflict=OnConflict.IGNORE)
        out.put((time.time(), cpu.spent()))
        store.engine.dispose()
    elif side == "peer":
        producer = pgq.Producer(url)
        go.wait()
        cpu = SelfCpu(producer.conn.info.backend_pid)
        for i in range(count):
            producer.one(f"{prefix}{i}", payload=padded(i))
        out.put((time.time(), cpu.spent()))
        producer.close()
    else:
        with baseline.connect(url) as conn:
            go.wait()
            cpu = SelfCpu(conn.info.backend_pid)
            for i in range(count):
                baseline.insert_one(
                    conn, QUEUE, f"{prefix}{i}", delay=3600, group=_group(i), data=json.dumps(padded(i))
                )
            out.put((time.time(), cpu.spent()))


def _enqueue_rate(side: str, url: str, clients: int, total: int) -> tuple[float, list[float]]:
    per = total // clients
    prefix = _prefix()
    started, results = race(_enqueue_client, [(side, url, f"{prefix}c{c}-", per) for c in range(clients)])
    events = per * clients
    return events / (max(t for t, _ in results) - started), CpuUse.total(c for _, c in results).per_event_us(events)


# -- enqueue a batch of 1,000 keyed, grouped events, one client, in this process ----------------------


def _batch_tickler(url: str) -> Callable[[list[str]], None]:
    from tickler.scheduler.models import NewEvent
    from tickler.scheduler.states import OnConflict

    store = store_for(url, pool_size=1)
    queue = store.queues.get(QUEUE)

    def insert(keys: list[str]) -> None:
        events = [
            NewEvent(item_key=k, data=padded(i), delay_seconds=3600, group_key=_group(i)) for i, k in enumerate(keys)
        ]
        store.events.schedule_batch(queue, events, actor="bench", on_conflict=OnConflict.IGNORE)

    return insert


def _batch_baseline(conn: Any) -> Callable[[list[str]], None]:
    def insert(keys: list[str]) -> None:
        groups = [_group(i) for i in range(len(keys))]
        data = [json.dumps(padded(i)) for i in range(len(keys))]
        baseline.insert_copy(conn, QUEUE, keys, delay=3600, groups=groups, data=data)

    return insert


def _batch_pgq(producer: pgq.Producer) -> Callable[[list[str]], None]:
    return lambda keys: producer.many(keys, payloads=[padded(i) for i in range(len(keys))])


def _batch_awa(producer: awa_peer.Producer) -> Callable[[list[str]], None]:
    return lambda keys: producer.many(
        keys, [padded(i) for i in range(len(keys))], [_group(i) for i in range(len(keys))]
    )


def _batch_rate(url: str, insert: Callable[[list[str]], None], batch: int, batches: int) -> tuple[float, list[float]]:
    prefix = _prefix()
    bodies = [[f"{prefix}{j}-{i}" for i in range(batch)] for j in range(batches)]
    insert([f"{prefix}warm-{i}" for i in range(batch)])  # pools, prepared statements
    with CpuMeter(url, in_process=True) as meter:
        started = time.perf_counter()
        for keys in bodies:
            insert(keys)
        seconds = time.perf_counter() - started
    return batch * batches / seconds, meter.use.per_event_us(batch * batches)


# -- drain -------------------------------------------------------------------------------------------


def _drain_peer(url: str, n: int, workers: int, batch: int, repeats: int) -> tuple[list[float], list[list[float]]]:
    runs, cpus = [], []
    with pgq.workers(url, workers, batch) as procs:
        for _ in range(repeats):
            pgq.fill(url, [f"{_prefix()}{i}" for i in range(n)], payloads=[padded(i) for i in range(n)])
            with CpuMeter(url, [p.pid for p in procs if p.pid]) as meter:
                due = pgq.make_due_soon(url)
                pgq.wait_until_drained(url)
            runs.append(n / (pgq.finish_time(url) - due))
            cpus.append(meter.use.per_event_us(n))
    return runs, cpus


# -- lateness ----------------------------------------------------------------------------------------


def _lateness_peer(url: str, rate: float, seconds: float, warmup: float) -> tuple[float, list[float]]:
    """p99 lateness (steady state) and CPU µs per delivered event of one pgqueuer worker."""
    offset = clock_offset(url)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seen.json"
        producer = pgq.Producer(url)
        try:
            with CpuMeter(url) as meter, pgq.workers(url, 1, 100, record=str(out)) as procs:
                meter.add([p.pid for p in procs if p.pid])
                produce(rate, seconds, lambda keys: producer.many(keys, delay=LEAD), _prefix())
                pgq.wait_until_drained(url)
        finally:
            producer.close()
        seen = json.loads(out.read_text())
    p99 = _steady_p99([(due, (wall + offset - due) * 1000) for wall, due in seen], warmup)
    return p99, meter.use.per_event_us(max(1, len(seen)))


# Lateness is compared in the steady state: the first WARMUP s (start-up) and the last TAIL s
# (once the producer stops no insert wakes a worker, and pgqueuer then sleeps until its own poll,
# up to ~1 s: a real behaviour, but of the run's end, which would decide a p99 over 30 s) are
# left out, the same for all three sides.
TAIL = 1.0


def _steady_p99(late: list[tuple[float, float]], warmup: float) -> float:
    """p99 of [(due, lateness ms)] without the first `warmup` s and the last TAIL s of due times."""
    first, last = min(due for due, _ in late), max(due for due, _ in late)
    return percentile([lag for due, lag in late if due - first >= warmup and last - due >= TAIL], 99)


def run(ctx: Context) -> list[Row]:
    peer = pgq.available()
    if not peer:
        say("pgqueuer is not installed (pip install -e '.[bench]'): the peer's cells say —")
    else:
        say(f"peer: pgqueuer {pgq.version()}")
    if awa_peer.available():
        say(f"peer: awa-pg {awa_peer.version()} (the batch row)")
    rows = [*_enqueue_rows(ctx, peer), _batch_row(ctx, peer), *_drain_rows(ctx, peer)]
    if not ctx.quick:  # quick: the lateness scenario proves the tickler and baseline sides
        rows += _lateness_rows(ctx, peer)
    return rows


def _row(name: str, unit: str, sides: dict[str, tuple[list[float], list[list[float]]]], target: str = "-") -> Row:
    """The row of sides "tickler", "baseline", "peer" (pgqueuer) and any other peer by its name."""
    t, b = sides["tickler"], sides["baseline"]
    p = sides.get("peer")
    others = {side: runs for side, runs in sides.items() if side not in ("tickler", "baseline", "peer")}
    row = Row(
        name,
        median(t[0]),
        median(b[0]),
        unit,
        target,
        None,
        runs=t[0],
        baseline_runs=b[0],
        peer=median(p[0]) if p else None,
        peer_runs=p[0] if p else [],
        others={side: median(runs) for side, (runs, _) in others.items()},
        others_runs={side: runs for side, (runs, _) in others.items()},
        cpu={side: median_cpu(cpus) for side, (_, cpus) in sides.items() if cpus},
    )
    peers = "".join(f", {side} {value:,.1f}" for side, value in row.others.items())
    say(
        f"{name}: tickler {row.tickler:,.1f}, pgqueuer {row.peer or 0:,.1f}{peers}, baseline {row.baseline:,.1f} {unit}"
    )
    return row


def _enqueue_rows(ctx: Context, peer: bool) -> list[Row]:
    total = ctx.size(40, 3_000)
    rows = []
    for clients in (1,) if ctx.quick else (1, 4):
        sides: dict[str, tuple[list[float], list[list[float]]]] = {}
        with ctx.database() as url:
            make_queue(url)
            baseline.install(url)
            for side in ("tickler", "baseline"):
                measured = [_enqueue_rate(side, url, clients, total) for _ in range(ctx.repeats)]
                sides[side] = ([m[0] for m in measured], [m[1] for m in measured])
        if peer:
            with ctx.database(tickler=False) as url:
                pgq.install(url)
                measured = [_enqueue_rate("peer", url, clients, total) for _ in range(ctx.repeats)]
                sides["peer"] = ([m[0] for m in measured], [m[1] for m in measured])
        name = f"peers: enqueue 1 keyed event in {GROUPS:,} groups/transaction, in-process, {clients} client(s)"
        rows.append(_row(name, "events/s", sides))
    return rows


def _batch_row(ctx: Context, peer: bool) -> Row:
    batch, batches = 1_000, ctx.size(1, 20)
    sides: dict[str, tuple[list[float], list[list[float]]]] = {}
    with ctx.database() as url:
        make_queue(url)
        baseline.install(url)
        insert = _batch_tickler(url)
        measured = [_batch_rate(url, insert, batch, batches) for _ in range(ctx.repeats)]
        sides["tickler"] = ([m[0] for m in measured], [m[1] for m in measured])
        with baseline.connect(url, autocommit=False) as conn:
            measured = [_batch_rate(url, _batch_baseline(conn), batch, batches) for _ in range(ctx.repeats)]
        sides["baseline"] = ([m[0] for m in measured], [m[1] for m in measured])
    if peer:
        with ctx.database(tickler=False) as url:
            pgq.install(url)
            producer = pgq.Producer(url)
            try:
                measured = [_batch_rate(url, _batch_pgq(producer), batch, batches) for _ in range(ctx.repeats)]
            finally:
                producer.close()
            sides["peer"] = ([m[0] for m in measured], [m[1] for m in measured])
    if awa_peer.available():
        with ctx.database(tickler=False) as url:
            awa_peer.install(url)
            awa = awa_peer.Producer(url)
            try:
                # awa's client keeps a pool: its backends are measured as the database's side
                measured = [_batch_rate(url, _batch_awa(awa), batch, batches) for _ in range(ctx.repeats)]
            finally:
                awa.close()
            sides["awa-pg"] = ([m[0] for m in measured], [m[1] for m in measured])
    name = (
        f"peers: enqueue a batch of {batch:,}, every event keyed, in {GROUPS:,} groups, on_conflict ignore, "
        "in-process, 1 client"
    )
    return _row(name, "events/s", sides)


def _drain_rows(ctx: Context, peer: bool) -> list[Row]:
    n = ctx.size(100, 20_000)
    configs = [(1, 10)] if ctx.quick else [(workers, batch) for workers in (1, 4) for batch in (1, 10, 100)]
    rows = []
    for workers, batch in configs:
        sides: dict[str, tuple[list[float], list[list[float]]]] = {}
        with ctx.database() as url:
            make_queue(url)
            baseline.install(url)
            room = {"concurrency": max(96, batch), "queue_concurrency": max(64, batch)}
            specs = [WorkerSpec(url, QUEUE, batch, name=f"w{i}", **room) for i in range(workers)]  # type: ignore[arg-type]
            with tickler_workers(specs) as procs:
                pids = [p.pid for p in procs if p.pid]
                measured = [tickler_drain(url, n, pids, groups=GROUPS, pad=True) for _ in range(ctx.repeats)]
            sides["tickler"] = ([m[0] for m in measured], [m[1].per_event_us(n) for m in measured])
            base = []
            for _ in range(ctx.repeats):
                baseline_fill(url, n, groups=GROUPS, pad=True)
                seconds, cpu = baseline_drain(url, QUEUE, workers=workers, batch=batch, group=True)
                base.append((n / seconds, cpu.per_event_us(n)))
            sides["baseline"] = ([m[0] for m in base], [m[1] for m in base])
        if peer:
            with ctx.database(tickler=False) as url:
                pgq.install(url)
                sides["peer"] = _drain_peer(url, n, workers, batch, ctx.repeats)
        name = (
            f"peers: drain no-op, batch {batch}, {workers} worker(s), {n:,} keyed events in {GROUPS:,} groups due at "
            f"once (a claim of tickler and the baseline takes {batch} whole group(s); pgqueuer, without groups, "
            f"{batch} job(s))"
        )
        rows.append(_row(name, "events/s", sides))
    return rows


def _lateness_rows(ctx: Context, peer: bool) -> list[Row]:
    seconds, warmup = ctx.size(3, 30), ctx.size(1, 5)
    rows = []
    for rate in (200, 2_000):
        sides: dict[str, tuple[list[float], list[list[float]]]] = {"tickler": ([], []), "baseline": ([], [])}
        if peer:
            sides["peer"] = ([], [])
        for _ in range(ctx.repeats):
            with ctx.database() as url:
                make_queue(url)
                baseline.install(url)
                # CPU: the worker from when it is ready; the database's backends, the producer's included
                with CpuMeter(url) as meter:
                    seen, _ = tickler_lateness(url, rate, seconds, _prefix(), on_workers=meter.add)
                sides["tickler"][0].append(_steady_p99([(due, lag * 1000) for due, lag in seen], warmup))
                sides["tickler"][1].append(meter.use.per_event_us(max(1, len(seen))))
                with CpuMeter(url) as meter:
                    base = baseline_lateness(url, rate, seconds, _prefix(), on_workers=meter.add)
                cut, tail = int(len(base) * warmup / seconds), int(len(base) * TAIL / seconds)
                sides["baseline"][0].append(percentile([x * 1000 for x in base[cut : len(base) - tail]], 99))
                sides["baseline"][1].append(meter.use.per_event_us(max(1, len(base))))
            if peer:
                with ctx.database(tickler=False) as url:
                    pgq.install(url)
                    p99, cpu = _lateness_peer(url, rate, seconds, warmup)
                    sides["peer"][0].append(p99)
                    sides["peer"][1].append(cpu)
        name = (
            f"peers: lateness due→handler p99 at {rate:,} events/s for {seconds} s, 1 worker (defaults; steady "
            f"state: the first {warmup} s and the last {TAIL:g} s of due times left out; CPU per delivered "
            "event, the database side with the producer's inserts)"
        )
        rows.append(_row(name, "ms", sides))
    return rows
