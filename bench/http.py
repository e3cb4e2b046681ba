"""tickler's API under a WSGI server (gunicorn, granian, waitress) for the HTTP scenarios, and a small
keep-alive client.

The client is http.client: it keeps the connection open when the server does (gunicorn's default
sync workers answer `Connection: close`, so it reconnects then; the gthread worker keeps it alive).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.harness import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The WSGI servers the HTTP scenarios compare; each runs tickler.wsgi:app with `workers` processes of
# `threads` threads (waitress: one process). "serve" is `tickler serve` itself (waitress, its
# dispatcher in the first process) with `workers` web processes (--web-processes).
SERVERS = ("gunicorn", "granian", "waitress", "serve")


def server_available(kind: str) -> bool:
    return (ROOT / ".venv" / "bin" / {"waitress": "waitress-serve", "serve": "tickler"}.get(kind, kind)).exists()


# The application the servers run: tickler's, or the same without the lean single-event route
# (bench/flask_only.py), to measure what the route saves within one run.
APPS = {"lean": "tickler.wsgi:app", "flask": "bench.flask_only:app"}


def _command(kind: str, port: int, workers: int, threads: int, app: str = APPS["lean"]) -> list[str]:
    bin_dir = ROOT / ".venv" / "bin"
    if kind == "gunicorn":
        command = [str(bin_dir / "gunicorn"), "-w", str(workers), "-b", f"127.0.0.1:{port}"]
        if threads:
            command += ["-k", "gthread", "--threads", str(threads)]
        return [*command, app]
    if kind == "granian":
        return [
            str(bin_dir / "granian"),
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--blocking-threads",
            str(max(1, threads)),
            "--no-log",
            app,
        ]
    if kind == "serve":
        if app != APPS["lean"]:
            raise ValueError("tickler serve runs tickler's own app only")
        return [
            str(bin_dir / "tickler"),
            "serve",
            "--port",
            str(port),
            "--threads",
            str(max(1, threads)),
            "--web-processes",
            str(workers),
        ]
    if kind == "waitress":
        return [
            str(bin_dir / "waitress-serve"),
            f"--listen=127.0.0.1:{port}",
            f"--threads={max(1, threads)}",
            app,
        ]
    raise ValueError(kind)


@contextmanager
def api_server(
    url: str,
    kind: str = "gunicorn",
    *,
    workers: int = 2,
    threads: int = 0,
    json: str = "",
    env: dict[str, str] | None = None,
    app: str = "lean",
) -> Iterator[tuple[int, int]]:
    """tickler's API under a WSGI server on a migrated database; yields (port, server pid).
    json: "" (orjson when installed), "stdlib" or "orjson" (TICKLER_JSON); env: more variables;
    app: "lean" (tickler.wsgi:app) or "flask" (without the lean single-event route)."""
    port = free_port()
    environ = {
        **os.environ,
        "TICKLER_DATABASE_URL": url,
        "TICKLER_MIGRATE_ON_START": "false",
        "TICKLER_LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    if json:
        environ["TICKLER_JSON"] = json
    proc = subprocess.Popen(
        _command(kind, port, workers, threads, APPS[app]),
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr if os.environ.get("BENCH_VERBOSE") else subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if Client(port, "").get("/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{kind} did not start")
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def gunicorn(url: str, *, workers: int = 2, threads: int = 0) -> Iterator[int]:
    """`gunicorn -w 2 -b 127.0.0.1:PORT tickler.wsgi:app` on a migrated database; yields the port."""
    with api_server(url, "gunicorn", workers=workers, threads=threads) as (port, _):
        yield port


class Client:
    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=payload, headers=self.headers)
                response = self.conn.getresponse()
                data = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # the server closed an idle keep-alive connection: reconnect once
                self.conn.close()
                if attempt:
                    raise
        return response.status, (json.loads(data) if data else None)

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.request("POST", path, body)
