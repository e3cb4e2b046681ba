"""The application's own CPU per single-event schedule, without a server: the WSGI app called
directly in one thread (no HTTP parsing, no sockets), with and without the lean route, at the log
level asked for. Interleaved rounds, so that the box's load falls on both alike.

    .venv/bin/python -m bench.ingest_inprocess [--total 2000] [--rounds 3] [--log-level INFO]

CPU is this process's (time.process_time: the request and the database client's work; the
database's own CPU is not in it). Log lines go to /dev/null in JSON, as a deployment writes them.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time
from typing import Any

from bench.harness import QUEUE, admin_token, create_database, drop_database, make_queue, resolve_server
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.logs import configure_logging, log_handler
from tickler.scheduler.migrate import migrate


def _environ(token: str, body: bytes) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": f"/v1/queues/{QUEUE}/events",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8080",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "127.0.0.1:8080",
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }


def _round(app: Any, token: str, tag: str, total: int) -> float:
    """CPU µs per request of `total` schedules of new keys."""
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        statuses.append(status)

    started = time.process_time()
    for i in range(total):
        body = json.dumps({"item_key": f"{tag}-{i}", "delay_seconds": 3600, "data": {"n": i}}).encode()
        for chunk in app(_environ(token, body), start_response):
            assert chunk
    used = time.process_time() - started
    if any(not s.startswith("202") for s in statuses):
        raise RuntimeError(f"not scheduled: {set(statuses)}")
    return used / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    admin = resolve_server(None)
    url = create_database(admin)
    try:
        migrate(url)
        make_queue(url)
        token = admin_token(url)
        configure_logging(args.log_level, "json")
        logging.getLogger().handlers[:] = [log_handler("json", open(os.devnull, "w"))]  # noqa: SIM115
        settings = Settings(database_url=url, migrate_on_start=False)
        apps = {"lean": create_app(settings, configure_logs=False)}
        apps["flask"] = create_app(settings, configure_logs=False, lean_schedule=False)
        for name, app in apps.items():
            _round(app, token, f"warm-{name}", 300)
        results: dict[str, list[float]] = {name: [] for name in apps}
        for r in range(args.rounds):
            for name, app in apps.items():
                results[name].append(_round(app, token, f"r{r}-{name}", args.total))
        for name, runs in results.items():
            runs_text = ", ".join(f"{x:,.0f}" for x in runs)
            print(f"{name}: {sorted(runs)[len(runs) // 2]:,.0f} µs CPU per request (rounds: {runs_text})")
        print(f"log level {args.log_level}, load average {os.getloadavg()[0]:.1f}")
        for app in apps.values():
            close_app(app)
    finally:
        drop_database(admin, url)


if __name__ == "__main__":
    main()
