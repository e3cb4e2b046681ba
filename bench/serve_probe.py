"""`tickler serve --web-processes 1 / 2` against gunicorn gthread, interleaved in one run: single-event
HTTP schedules from N keep-alive clients, events/s and CPU per event of the server's processes
(all of them, /proc) and the database; and serve's start-up (launch to the first 200 of /readyz).

    .venv/bin/python -m bench.serve_probe --rounds 3 --clients 4 --total 3000

Same database as bench/ingest_probe.py (TICKLER_BENCH_DATABASE_URL, else 127.0.0.1:5432, else
embedded), fresh and dropped afterwards. Each round runs every configuration once, in turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from bench.cpu import CpuMeter, proc_cpu
from bench.harness import ROOT, admin_token, create_database, drop_database, make_queue, resolve_server
from bench.http import Client, api_server, free_port
from bench.ingest_probe import run_clients
from tickler.scheduler.migrate import migrate

# (label, server kind, processes, threads per process)
CONFIGS = {
    "gunicorn": ("gunicorn gthread -w 2 --threads 4", "gunicorn", 2, 4),
    "serve1": ("tickler serve --web-processes 1 --threads 8", "serve", 1, 8),
    "serve2": ("tickler serve --web-processes 2 --threads 4", "serve", 2, 4),
    "serve2x8": ("tickler serve --web-processes 2 --threads 8 (the defaults)", "serve", 2, 8),
}


def _tree_cpu(pid: int) -> float:
    return sum(_each_cpu(pid).values())


def _each_cpu(pid: int) -> dict[int, float]:
    from bench.cpu import _children

    return {p: proc_cpu(p) or 0.0 for p in [pid, *_children(pid)]}


def _split(before: dict[int, float], after: dict[int, float]) -> str:
    """Each process's share of the server's CPU in the timed run (the busy ones: not gunicorn's arbiter
    or serve's supervisor), largest first: how evenly the kernel spread the clients' connections."""
    used = sorted((after[p] - before.get(p, 0.0) for p in after), reverse=True)
    total = sum(used) or 1.0
    return "/".join(f"{100 * u / total:.0f}" for u in used if u / total >= 0.02)


def startup(url: str, processes: int) -> tuple[float, float]:
    """(seconds from launch to the first 200 of /readyz, CPU seconds of serve's processes by then)."""
    port = free_port()
    env = {**os.environ, "TICKLER_DATABASE_URL": url, "TICKLER_LOG_LEVEL": "WARNING"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/tickler"), "serve", "--port", str(port), "--web-processes", str(processes)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            try:
                if Client(port, "").get("/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() - started > 60:
                raise RuntimeError("serve did not start")
            time.sleep(0.01)
        return time.monotonic() - started, _tree_cpu(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", nargs="+", default=["gunicorn", "serve1", "serve2"], choices=sorted(CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--total", type=int, default=3000)
    parser.add_argument("--startups", type=int, default=0, help="also time serve's start-up this many times each")
    args = parser.parse_args()
    admin = resolve_server(None)
    url = create_database(admin)
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in args.configs}
    try:
        migrate(url)
        make_queue(url)
        token = admin_token(url)
        for r in range(args.rounds):
            for name in args.configs:
                label, kind, workers, threads = CONFIGS[name]
                with api_server(url, kind, workers=workers, threads=threads) as (port, pid):
                    run_clients(port, token, 400, args.clients, f"w{r}{name}")
                    before = _each_cpu(pid)
                    with CpuMeter(url, [pid]) as meter:
                        rate, _ = run_clients(port, token, args.total, args.clients, f"m{r}{name}")
                    split = _split(before, _each_cpu(pid))
                    app, db = meter.use.per_event_us(args.total // args.clients * args.clients)
                load = os.getloadavg()[0]
                results[name].append((rate, app, db, load))
                print(
                    f"round {r + 1} {label}: {rate:,.0f}/s  app {app:,.0f} µs  db {db:,.0f} µs/event  "
                    f"CPU split {split} %  load {load:.1f}",
                    flush=True,
                )
        print("\nmedians over the rounds (ratio: against gunicorn of the same round, median of the ratios)")
        for name in args.configs:
            rates = [x[0] for x in results[name]]
            ratios = (
                [x[0] / g[0] for x, g in zip(results[name], results["gunicorn"], strict=True)]
                if "gunicorn" in results
                else [float("nan")]
            )
            print(
                f"{CONFIGS[name][0]}: {statistics.median(rates):,.0f}/s (x{statistics.median(ratios):.2f} gunicorn)  "
                f"app {statistics.median(x[1] for x in results[name]):,.0f} µs  "
                f"db {statistics.median(x[2] for x in results[name]):,.0f} µs/event  "
                f"load {min(x[3] for x in results[name]):.1f}-{max(x[3] for x in results[name]):.1f}"
            )
        if args.startups:
            times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
            for _ in range(args.startups):
                for processes in (1, 2):
                    times[processes].append(startup(url, processes))
            for processes, got in times.items():
                print(
                    f"start-up, --web-processes {processes}: {statistics.median(t for t, _ in got):.2f} s to /readyz, "
                    f"{statistics.median(c for _, c in got):.2f} s CPU  (runs: "
                    + ", ".join(f"{t:.2f}" for t, _ in got)
                    + f")  load {os.getloadavg()[0]:.1f}"
                )
    finally:
        drop_database(admin, url)


if __name__ == "__main__":
    main()
