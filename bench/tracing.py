"""What tracing costs (SPEC §11): HTTP scheduling and a webhook drain, with tracing off, on with
an OTLP exporter, and on with no exporter (OTEL_TRACES_EXPORTER=none: spans made, then dropped),
in the same run, the modes interleaved round by round.

    .venv/bin/python -m bench.tracing [--requests 4000] [--drain 5000] [--rounds 3]

A fourth mode, tracing off and no `traceparent` sent, shows what keeping the callers' context
with the event costs apart from tracing. Each mode runs `tickler serve` (API and dispatcher in one
process) on a fresh database; in the other modes every request carries a `traceparent`, as a
traced caller's would. The exporter sends to a local
no-op receiver (the webhook one answers 204, which OTLP/HTTP takes as accepted).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from statistics import median
from typing import Any

from bench.drain import make_due_soon
from bench.harness import (
    QUEUE,
    ROOT,
    create_database,
    drop_database,
    finish_time,
    open_count,
    resolve_server,
    say,
    wait_until_drained,
)
from bench.procs import SPAWN
from bench.receiver import serve
from tickler.scheduler.db import create_engine
from tickler.scheduler.migrate import migrate
from tickler.scheduler.store import Store

MODES = ("off", "on, OTLP exporter", "on, no exporter", "off, no traceparent sent")
CLIENTS = 4
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(mode: str, sink: int, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(TICKLER_DATABASE_URL=url, TICKLER_LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))
    if mode == MODES[1]:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink}"
    elif mode == MODES[2]:
        env["OTEL_TRACES_EXPORTER"] = "none"
    return env


@contextmanager
def _serving(mode: str, sink: int, url: str) -> Iterator[int]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tickler.cli", "serve", "--port", str(port), "--threads", "8"],
        env=_env(mode, sink, url),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("tickler serve did not start") from None
                time.sleep(0.1)
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def _post(connection: http.client.HTTPConnection, path: str, body: Any, headers: dict[str, str]) -> int:
    connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    response = connection.getresponse()
    response.read()
    return response.status


def _headers(token: str, mode: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "traceparent": TRACEPARENT}
    if mode == MODES[3]:  # what keeping the caller's context costs, beside tracing itself
        del headers["traceparent"]
    return headers


def schedule_rate(port: int, token: str, n: int, prefix: str, mode: str) -> float:
    """Events/s scheduled one per request by CLIENTS keep-alive clients (each with a traceparent)."""
    headers = _headers(token, mode)
    per = n // CLIENTS
    failures: list[int] = []
    go = threading.Barrier(CLIENTS + 1)

    def client(c: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        go.wait()
        for i in range(per):
            body = {"item_key": f"{prefix}-{c}-{i}", "delay_seconds": 3600, "data": {"n": i}}
            status = _post(connection, f"/v1/queues/{QUEUE}/events", body, headers)
            if status != 202:
                failures.append(status)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for thread in threads:
        thread.start()
    go.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed: {failures[:3]}")
    return per * CLIENTS / elapsed


def drain_rate(url: str, port: int, token: str, n: int, mode: str) -> float:
    """Events/s delivered by the server's dispatcher (webhooks to the no-op receiver), from the
    instant they all fall due to the last finish. Scheduled in batches that carry a traceparent."""
    headers = _headers(token, mode)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for start in range(0, n, 1000):
        events = [
            {"item_key": f"d{i}", "delay_seconds": 3600, "data": {"n": i}} for i in range(start, min(n, start + 1000))
        ]
        status = _post(connection, f"/v1/queues/{QUEUE}/events/batch", {"events": events}, headers)
        if status != 200:
            raise RuntimeError(f"batch failed: {status}")
    total = open_count(url)  # with the scheduling benchmark's events: all fall due together
    due = make_due_soon(url)
    wait_until_drained(url)
    return total / (finish_time(url) - due)


def _prepare(admin_url: str, sink: int) -> tuple[str, str]:
    url = create_database(admin_url)
    migrate(url)
    engine = create_engine(url, pool_size=1)
    try:
        store = Store(engine)
        from tickler.config import Settings
        from tickler.scheduler.store import QueueSettings

        store.queues.put(
            QUEUE,
            QueueSettings(
                delivery_mode="webhook", webhook_url=f"http://127.0.0.1:{sink}/hook", webhook_timeout_seconds=10
            ),
            Settings(),
        )
        token = store.tokens.create("bench", queues=[QUEUE])
    finally:
        engine.dispose()
    return url, token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=4000, help="events scheduled one per request, per round")
    parser.add_argument("--drain", type=int, default=5000, help="events drained per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the medians to this file")
    args = parser.parse_args(argv)
    admin_url = resolve_server(None)
    sink = _free_port()
    ready = SPAWN.Event()
    receiver = SPAWN.Process(target=serve, args=(sink, ready), daemon=True)
    receiver.start()
    ready.wait(10)
    results: dict[str, dict[str, list[float]]] = {m: {"schedule": [], "drain": []} for m in MODES}
    try:
        for round_ in range(args.rounds):
            for mode in MODES:
                url, token = _prepare(admin_url, sink)
                try:
                    with _serving(mode, sink, url) as port:
                        schedule_rate(port, token, min(400, args.requests), f"warm{round_}", mode)
                        scheduled = schedule_rate(port, token, args.requests, f"r{round_}", mode)
                        drained = drain_rate(url, port, token, args.drain, mode)
                finally:
                    drop_database(admin_url, url)
                results[mode]["schedule"].append(scheduled)
                results[mode]["drain"].append(drained)
                say(f"round {round_ + 1}, tracing {mode}: schedule {scheduled:,.0f}/s, drain {drained:,.0f}/s")
    finally:
        receiver.terminate()
        receiver.join(5)
    table = {m: {k: median(v) for k, v in results[m].items()} for m in MODES}
    off = table[MODES[0]]
    print("| tracing | HTTP schedule (events/s) | vs off | drain (events/s) | vs off |\n|---|---|---|---|---|")
    for mode in MODES:
        row = table[mode]
        print(
            f"| {mode} | {row['schedule']:,.0f} | {row['schedule'] / off['schedule']:.2f} "
            f"| {row['drain']:,.0f} | {row['drain'] / off['drain']:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": results, "medians": table}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
