"""kill -9 of the primary at a steady schedule rate, and promotion of its synchronous standby.

    python -m bench.failover [--rate 500] [--seconds 16] [--lead 1] [--detect 0.5]

A primary and a synchronous standby (tests/pg_cluster.py, fsync on), `tickler serve` on the URL
listing both, 8 client threads scheduling one event per request (due `--lead` s later) at `--rate`
in all, a worker process recording each delivery. Halfway, the primary is killed and the standby
promoted `--detect` s later. Printed (docs/deploy.md): promotion -> first 202 and -> first
delivery, the lateness of the events due in the gap, lost events and uncounted duplicates."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import ROOT, admin_token, clock_offset, free_port, make_queue, percentile, poll, wait_until_drained
from bench.http import Client, ready
from bench.procs import running
from tests import pg_cluster
from tickler.scheduler.logs import configure_logging

CLIENTS = 8


def _worker(url: str, out_path: str, ready: Any, stop: Any) -> None:
    from tickler.config import Settings
    from tickler.scheduler.models import Event
    from tickler.scheduler.worker import Worker

    configure_logging("ERROR")
    seen: list[tuple[float, str, int, float]] = []
    worker = Worker(settings=Settings(database_url=url, migrate_on_start=False), name="failover")

    @worker.handler("jobs")
    def record(event: Event) -> None:
        seen.append((time.time(), event.item_key, event.redeliver_count, event.schedule_on.timestamp()))

    worker.start()
    ready.set()
    stop.wait()
    worker.stop()
    Path(out_path).write_text(json.dumps(seen))


def _client(port: int, token: str, n: int, rate: float, until: float, lead: float, answers: list[Any]) -> None:
    client, sent, started = Client(port, token), 0, time.monotonic()
    while (now := time.monotonic()) < until:
        if sent > (now - started) * rate:
            time.sleep(min(0.01, sent / rate - (now - started)))  # the next request's turn
            continue
        key, sent = f"c{n}-{sent}", sent + 1
        try:
            status, _ = client.post("/v1/queues/jobs/events", {"item_key": key, "delay_seconds": lead, "data": {}})
        except OSError:
            status, client = 0, Client(port, token)
        answers.append((key, status, time.monotonic()))


def run(rate: float, seconds: float, lead: float, detect: float) -> dict[str, Any]:
    root = pg_cluster.make_root()
    primary, standby = pg_cluster.synchronous_pair(root, fsync="on", max_connections="200")
    url = f"postgresql://postgres@{primary.host()},{standby.host()}/tickler?target_session_attrs=read-write"
    serve = None
    try:
        make_queue(primary.url("tickler"), "jobs", lease_seconds=5)  # a lost ack: redelivered after 5 s
        token, offset, port = admin_token(primary.url("tickler")), clock_offset(primary.url("tickler")), free_port()
        env = {**os.environ, "TICKLER_DATABASE_URL": url, "TICKLER_MIGRATE_ON_START": "false",
               "TICKLER_CONNECT_TIMEOUT": "2", "TICKLER_LOG_LEVEL": "ERROR"}  # fmt: skip
        serve = subprocess.Popen([str(ROOT / ".venv/bin/tickler"), "serve", "--port", str(port)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        poll(lambda: ready(port), what="tickler serve not answering", timeout=60)
        seen_path = Path(tempfile.mkdtemp(prefix="tickler-failover-")) / "seen.json"
        answers: list[Any] = []
        with running(_worker, [(url, str(seen_path))], what="worker", settle=0.5):
            until = time.monotonic() + seconds
            clients = [threading.Thread(target=_client, args=(port, token, n, rate / CLIENTS, until, lead, answers))
                       for n in range(CLIENTS)]  # fmt: skip
            for client in clients:
                client.start()
            time.sleep(seconds / 2)  # steady traffic before the kill
            killed, killed_wall = time.monotonic(), time.time()
            primary.kill()  # (it waits for every process of it to be gone)
            time.sleep(detect)  # the failover manager deciding
            standby.promote()
            promoted, promoted_wall = time.monotonic(), time.time()
            for client in clients:
                client.join()
            wait_until_drained(url, timeout=120)  # the last events due, and the redeliveries
        seen = json.loads(seen_path.read_text())  # written by the worker as it stopped
        shutil.rmtree(seen_path.parent)
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(30)
        for node in (primary, standby):
            node.stop()
        pg_cluster.remove_root(root)
    accepted = {key for key, status, _ in answers if status == 202}
    by_key: dict[str, list[int]] = {}
    for _, key, redeliveries, _ in seen:
        by_key.setdefault(key, []).append(redeliveries)
    in_gap = [(wall, due - offset) for wall, _, _, due in seen if killed_wall <= due - offset <= promoted_wall]
    gap, flowed = [w - due for w, due in in_gap], [w - promoted_wall for w, _ in in_gap]
    return {
        "rate_achieved": round(len(answers) / seconds),
        "answers": Counter(status for _, status, _ in answers),
        "kill_to_promotion_s": round(promoted - killed, 3),
        "promotion_to_first_202_s": round(min(at for _, s, at in answers if s == 202 and at > promoted) - promoted, 3),
        "promotion_to_first_delivery_s": round(min(w for w, _, _, _ in seen if w > promoted_wall) - promoted_wall, 3),
        "due_in_gap": len(gap),
        # due -> delivered, and promotion -> delivered (the backlog of the gap flowing again)
        "gap_lateness_p50_p99_max_s": [round(percentile(gap, p), 3) for p in (50, 99, 100)],
        "gap_after_promotion_p50_p99_max_s": [round(percentile(flowed, p), 3) for p in (50, 99, 100)],
        "lost": len(accepted - set(by_key)),
        "delivered_twice": sum(len(c) > 1 for c in by_key.values()),
        "delivered_twice_uncounted": sum(len(c) > 1 and max(c[1:]) == 0 for c in by_key.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0])
    for name, default in (("--rate", 500.0), ("--seconds", 16.0), ("--lead", 1.0), ("--detect", 0.5)):
        parser.add_argument(name, type=float, default=default)
    args = parser.parse_args(argv)
    configure_logging("ERROR")
    print(json.dumps(run(args.rate, args.seconds, args.lead, args.detect)), file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
