"""tickler, the peers (pgqueuer; awa-pg for the batch) and the plain-SQL baseline doing the same work
in the same run, each side through its public interface (bench/pgq.py, bench/awa_peer.py,
bench/baseline.py): tickler and the baseline share a fresh database (one after the other), each
peer gets one of its own. What the sides do, and the one shape of every event (a keyed, grouped
producer's: GROUPS groups, the payload padded(n), on_conflict `ignore`), the page says: the
family "Beside pgqueuer and awa-pg" of bench/report.py.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench import awa_peer, baseline, pgq
from bench.cpu import CpuMeter, CpuUse, SelfCpu
from bench.harness import QUEUE, Context, Row, clock_offset, database, median, median_cpu, percentile, say, store_for
from bench.lateness import LEAD, baseline_lateness, produce, tickler_lateness
from bench.procs import baseline_drain_rate, batch_workers, make_due_soon, padded, race, tickler_drain, tickler_workers
from tickler.scheduler.models import NewEvent
from tickler.scheduler.states import OnConflict

_round = [0]
GROUPS = 1_000
# A side's runs: the figure of each, and its CPU µs/event [app, db].
Side = tuple[list[float], list[list[float]]]


def _group(i: int) -> str:
    return f"g{i % GROUPS}"


def _prefix() -> str:
    _round[0] += 1
    return f"p{_round[0]}-"


# -- enqueue, one event per transaction, in-process, N client processes -------------------------------


def _enqueue_client(side: str, url: str, prefix: str, count: int, go: Any, out: Any) -> None:
    if side == "tickler":
        with store_for(url) as store:
            queue = store.queues.get(QUEUE)
            with store.engine.connect() as conn:  # warm the pool: its one connection's backend is measured
                backend = int(conn.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
            go.wait()
            cpu = SelfCpu(backend)
            for i in range(count):
                event = NewEvent(item_key=f"{prefix}{i}", data=padded(i), delay_seconds=3600, group_key=_group(i))
                store.events.schedule(queue, event, actor="bench", on_conflict=OnConflict.IGNORE)
            out.put((time.time(), cpu.spent()))
    elif side == "peer":
        with closing(pgq.Producer(url)) as producer:
            go.wait()
            cpu = SelfCpu(producer.conn.info.backend_pid)
            for i in range(count):
                producer.one(f"{prefix}{i}", padded(i))
            out.put((time.time(), cpu.spent()))
    else:
        with baseline.connect(url) as conn:
            go.wait()
            cpu = SelfCpu(conn.info.backend_pid)
            for i in range(count):
                data = json.dumps(padded(i))
                baseline.insert_one(conn, QUEUE, f"{prefix}{i}", delay=3600, group=_group(i), data=data)
            out.put((time.time(), cpu.spent()))


def _enqueue_rate(side: str, url: str, clients: int, total: int) -> tuple[float, list[float]]:
    per = total // clients
    prefix = _prefix()
    started, results = race(_enqueue_client, [(side, url, f"{prefix}c{c}-", per) for c in range(clients)])
    events = per * clients
    return events / (max(t for t, _ in results) - started), CpuUse.total(c for _, c in results).per_event_us(events)


# -- enqueue a batch of 1,000 keyed, grouped events, one client, in this process ----------------------


def _batch_tickler(store: Any) -> Callable[[list[str]], None]:
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


def _drain_peer(url: str, n: int, pids: list[int]) -> tuple[float, list[float]]:
    pgq.fill(url, [f"{_prefix()}{i}" for i in range(n)], [padded(i) for i in range(n)])
    with CpuMeter(url, pids) as meter:
        due = make_due_soon(url, table=pgq.TABLE, column="execute_after", where="true")  # every job is open
        pgq.wait_until_drained(url)
    return n / (pgq.finish_time(url) - due), meter.use.per_event_us(n)


# -- lateness ----------------------------------------------------------------------------------------

# Lateness is compared in the steady state: the first WARMUP s (start-up) and the last TAIL s
# (once the producer stops no insert wakes a worker, and pgqueuer then sleeps until its own poll,
# up to ~1 s: a real behaviour, but of the run's end, which would decide a p99 over 30 s) are
# left out, the same for all three sides.
TAIL = 1.0


def _steady_p99(late: list[tuple[float, float]], warmup: float) -> float:
    """p99 of [(due, lateness ms)] without the first `warmup` s and the last TAIL s of due times."""
    first, last = min(due for due, _ in late), max(due for due, _ in late)
    return percentile([lag for due, lag in late if due - first >= warmup and last - due >= TAIL], 99)


# Each: p99 lateness (steady state) and CPU µs per delivered event. CPU: the worker from when it is
# ready; the database's backends, the producer's included.


def _lateness_tickler(url: str, rate: float, seconds: float, warmup: float) -> tuple[float, list[float]]:
    with CpuMeter(url) as meter:
        seen, _ = tickler_lateness(url, rate, seconds, _prefix(), on_workers=meter.add)
    p99 = _steady_p99([(due, lag * 1000) for due, lag in seen], warmup)
    return p99, meter.use.per_event_us(max(1, len(seen)))


def _lateness_baseline(url: str, rate: float, seconds: float, warmup: float) -> tuple[float, list[float]]:
    with CpuMeter(url) as meter:
        base = baseline_lateness(url, rate, seconds, _prefix(), on_workers=meter.add)
    cut, tail = int(len(base) * warmup / seconds), int(len(base) * TAIL / seconds)
    return percentile([x * 1000 for x in base[cut : len(base) - tail]], 99), meter.use.per_event_us(max(1, len(base)))


def _lateness_peer(url: str, rate: float, seconds: float, warmup: float) -> tuple[float, list[float]]:
    offset = clock_offset(url)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seen.json"
        with (
            closing(pgq.Producer(url)) as producer,
            CpuMeter(url) as meter,
            pgq.workers(url, 1, 100, record=str(out)) as procs,
        ):
            meter.add([p.pid for p in procs if p.pid])
            produce(rate, seconds, lambda keys: producer.many(keys, delay=LEAD), _prefix())
            pgq.wait_until_drained(url)
        seen = json.loads(out.read_text())
    p99 = _steady_p99([(due, (wall + offset - due) * 1000) for wall, due in seen], warmup)
    return p99, meter.use.per_event_us(max(1, len(seen)))


def _installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def run(ctx: Context) -> list[Row]:
    peers = {name: _installed(name) for name in ("pgqueuer", "awa-pg")}
    say(f"peers: {peers} (None: not installed, its cells say —; awa-pg is in the batch row only)")
    peer = peers["pgqueuer"] is not None
    rows = [*_enqueue_rows(ctx, peer), _batch_row(ctx, peer, peers["awa-pg"] is not None), *_drain_rows(ctx, peer)]
    if not ctx.quick:  # quick: the lateness scenario proves the tickler and baseline sides
        rows += _lateness_rows(ctx, peer)
    return rows


def _row(name: str, unit: str, sides: dict[str, Side]) -> Row:
    """The row of sides "tickler", "baseline", "peer" (pgqueuer) and any other peer by its name."""
    others = {side: figures for side, (figures, _) in sides.items()}
    t, b, p = others.pop("tickler"), others.pop("baseline"), others.pop("peer", None)
    cpu = {side: median_cpu(cpus) for side, (_, cpus) in sides.items() if cpus}
    row = Row(name, median(t), median(b), unit, "-", None, runs=t, baseline_runs=b, peer_runs=p or [], cpu=cpu)
    row.peer = median(p) if p else None
    row.others, row.others_runs = {side: median(figures) for side, figures in others.items()}, others
    more = "".join(f", {side} {value:,.1f}" for side, value in row.others.items())
    say(f"{name}: tickler {row.tickler:,.1f}, pgqueuer {row.peer or 0:,.1f}{more}, baseline {row.baseline:,.1f} {unit}")
    return row


def _enqueue_rows(ctx: Context, peer: bool) -> list[Row]:
    total = ctx.size(40, 3_000)
    rows = []
    for clients in (1,) if ctx.quick else (1, 4):
        with ctx.shared_database() as url:
            sides = {side: ctx.repeat(_enqueue_rate, side, url, clients, total) for side in ("tickler", "baseline")}
        if peer:
            with database(ctx.admin_url, tickler=False) as url:
                pgq.install(url)
                sides["peer"] = ctx.repeat(_enqueue_rate, "peer", url, clients, total)
        name = f"peers: enqueue 1 keyed event in {GROUPS:,} groups/transaction, in-process, {clients} client(s)"
        rows.append(_row(name, "events/s", sides))
    return rows


def _batch_row(ctx: Context, peer: bool, awa: bool) -> Row:
    batch, batches = 1_000, ctx.size(1, 20)
    sides: dict[str, Side] = {}
    with ctx.shared_database() as url:
        with store_for(url) as store:
            sides["tickler"] = ctx.repeat(_batch_rate, url, _batch_tickler(store), batch, batches)
        with baseline.connect(url, autocommit=False) as conn:
            sides["baseline"] = ctx.repeat(_batch_rate, url, _batch_baseline(conn), batch, batches)
    # awa's client keeps a pool: its backends are measured as the database's side
    for side, module, wanted, insert in (("peer", pgq, peer, _batch_pgq), ("awa-pg", awa_peer, awa, _batch_awa)):
        if wanted:
            with database(ctx.admin_url, tickler=False) as url:
                module.install(url)
                with closing(module.Producer(url)) as producer:
                    sides[side] = ctx.repeat(_batch_rate, url, insert(producer), batch, batches)
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
        sides: dict[str, Side] = {}
        with ctx.shared_database() as url:
            with tickler_workers(batch_workers(url, workers, batch)) as procs:
                pids = [p.pid for p in procs if p.pid]
                sides["tickler"] = ctx.repeat(tickler_drain, url, n, pids, groups=GROUPS, pad=True)
            sides["baseline"] = ctx.repeat(
                baseline_drain_rate, url, n, workers=workers, batch=batch, groups=GROUPS, pad=True
            )
        if peer:
            with database(ctx.admin_url, tickler=False) as url:
                pgq.install(url)
                with pgq.workers(url, workers, batch) as procs:
                    sides["peer"] = ctx.repeat(_drain_peer, url, n, [p.pid for p in procs if p.pid])
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
        sides: dict[str, Side] = {side: ([], []) for side in ("tickler", "baseline", *(["peer"] if peer else []))}
        for _ in range(ctx.repeats):  # the sides take turns, on a fresh database each
            measured = {}
            with ctx.shared_database() as url:
                measured["tickler"] = _lateness_tickler(url, rate, seconds, warmup)
                measured["baseline"] = _lateness_baseline(url, rate, seconds, warmup)
            if peer:
                with database(ctx.admin_url, tickler=False) as url:
                    pgq.install(url)
                    measured["peer"] = _lateness_peer(url, rate, seconds, warmup)
            for side, (p99, cpu) in measured.items():
                sides[side][0].append(p99)
                sides[side][1].append(cpu)
        name = (
            f"peers: lateness due→handler p99 at {rate:,} events/s for {seconds} s, 1 worker (defaults; steady "
            f"state: the first {warmup} s and the last {TAIL:g} s of due times left out; CPU per delivered "
            "event, the database side with the producer's inserts)"
        )
        rows.append(_row(name, "ms", sides))
    return rows
