"""A real HTTP proxy in front of the live server that fails the first requests on purpose: it
answers 503, drops the connection without an answer, or forwards the request and loses the
answer (the server acted, the client never hears), then forwards. It counts what it saw, so
tests can tell a retried call from one that was sent once."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.helpers_http import QuietHandler, serving

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


@dataclass
class FlakyProxy:
    url: str = ""
    # What to do with the next requests, in order: "503", "500" (an HTML page, as a broken proxy
    # would send), "drop" (not forwarded) or "lose" (forwarded, the answer dropped); forwarded
    # once it runs out.
    script: list[str] = field(default_factory=list)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_next(self, *how: str) -> None:
        with self.lock:
            self.script[:] = list(how)
            self.seen.clear()


@contextmanager
def flaky_proxy(upstream: str) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy()
    target = urlsplit(upstream)

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with proxy.lock:
                proxy.seen.append((self.command, self.path))
                action = proxy.script.pop(0) if proxy.script else "forward"
            if action == "drop":
                self.close_connection = True
                self.connection.close()  # no status line at all: the client sees a dropped connection
                return
            if action == "500":
                self._answer(500, {"Content-Type": "text/html"}, b"<html><body>Internal Server Error</body></html>")
                return
            if action == "503":
                payload = b'{"type": "about:blank", "title": "Service unavailable", "status": 503, "detail": "busy"}'
                self._answer(503, {"Content-Type": "application/problem+json", "Retry-After": "0"}, payload)
                return
            upstream_conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream_conn.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream_conn.getresponse()
                payload = response.read()
                passed = {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP}
                if action == "lose":
                    self.close_connection = True
                    self.connection.close()
                    return
                self._answer(response.status, passed, payload)
            finally:
                upstream_conn.close()

        def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    with serving(Handler) as url:
        proxy.url = url
        yield proxy
