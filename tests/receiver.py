"""A real local HTTP receiver for webhook tests: answers from a script, records what it got."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    # (status, extra headers) to answer, in order; 200 once it runs out.
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Received]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.received) >= count, timeout=timeout):
                raise AssertionError(f"expected {count} deliveries, got {len(self.received)}")
            return list(self.received)


@contextmanager
def running_receiver(script: list[tuple[int, dict[str, str]]] | None = None) -> Iterator[Receiver]:
    receiver = Receiver(url="", script=list(script or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with receiver.changed:
                status, extra = receiver.script.pop(0) if receiver.script else (200, {})
                receiver.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                receiver.changed.notify_all()
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_port}/hooks"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
