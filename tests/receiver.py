"""Real local HTTP receivers for webhook tests: one answers from a script and records what it got;
the modest one is the plain receiver a new user writes first."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.helpers_http import QuietHandler, serving


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

    class Handler(QuietHandler):
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

    with serving(Handler) as base:
        receiver.url = f"{base}/hooks"
        yield receiver


@contextmanager
def modest_receiver() -> Iterator[tuple[dict[int, float], str]]:
    """The receiver a new user writes first: a plain standard-library ThreadingHTTPServer, listen
    backlog 5 (socketserver's default), HTTP/1.0 (a new connection per request). Yields
    {event id: first arrival time} and its URL."""
    arrived: dict[int, float] = {}
    lock = threading.Lock()

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            now = time.time()
            with lock:
                for event in body["events"]:
                    arrived.setdefault(event["id"], now)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler, backlog=5) as base:  # the default, spelled out: the burst test's point
        yield arrived, f"{base}/hooks"
