"""Real local HTTP servers for tests (webhook receivers, proxies, the API app): served on a free port
of 127.0.0.1 from a thread, shut down and joined on the way out."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any
from wsgiref.types import WSGIApplication

from werkzeug.serving import make_server


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test output clean (no access log on stderr)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def body(self) -> bytes:
        """The request's body (its Content-Length bytes)."""
        return self.rfile.read(int(self.headers["Content-Length"]))


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], *, backlog: int = 5) -> Iterator[str]:
    """Serve `handler`, one thread a request, with a listen backlog of `backlog` (socketserver's
    default unless told); yields the base URL, http://127.0.0.1:PORT."""

    class Server(ThreadingHTTPServer):
        request_queue_size = backlog
        daemon_threads = True

    with _running(Server(("127.0.0.1", 0), handler)) as url:
        yield url


@contextmanager
def serving_app(app: WSGIApplication) -> Iterator[str]:
    """A WSGI app (the API's Flask app, a receiver) behind a real threaded HTTP server (werkzeug's);
    yields its base URL."""
    with _running(make_server("127.0.0.1", 0, app, threaded=True)) as url:
        yield url


@contextmanager
def _running(server: HTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
