"""tickler's API under gunicorn for the HTTP scenarios, and a small keep-alive client.

The client is http.client: it keeps the connection open when the server does (gunicorn's default
sync workers answer `Connection: close`, so it reconnects then; the gthread worker keeps it alive).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.harness import ROOT, free_port, poll


@contextmanager
def gunicorn(url: str, *, workers: int = 2, threads: int = 0) -> Iterator[tuple[int, int]]:
    """`gunicorn -w 2 -b 127.0.0.1:PORT tickler.wsgi:app` (gthread with `threads`) on a migrated
    database; yields (port, server pid)."""
    port = free_port()
    command = [str(ROOT / ".venv" / "bin" / "gunicorn"), "-w", str(workers), "-b", f"127.0.0.1:{port}"]
    command += ["-k", "gthread", "--threads", str(threads)] if threads else []
    environ = {"TICKLER_DATABASE_URL": url, "TICKLER_MIGRATE_ON_START": "false", "TICKLER_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [*command, "tickler.wsgi:app"],
        cwd=ROOT,
        env={**os.environ, **environ},
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr if os.environ.get("BENCH_VERBOSE") else subprocess.DEVNULL,
    )
    try:
        poll(lambda: proc.poll() is not None or ready(port), what="gunicorn not answering", timeout=60)
        if proc.returncode is not None:
            raise RuntimeError("gunicorn did not start")
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


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

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.request("POST", path, body)


def ready(port: int) -> bool:
    """Whether tickler's API on the port answers /readyz with 200."""
    try:
        return Client(port, "").request("GET", "/readyz")[0] == 200
    except OSError:
        return False
