"""The single-event schedule (`POST /v1/queues/{queue}/events`) without Flask's request cycle.

Most calls to tickler are this one, with a valid token, a queue the caller may use and a valid
body; Flask/werkzeug's request cycle (routing, request and response objects, hooks) costs more
CPU than the rest of such a call. `LeanSchedule` sits in front of the Flask app (its `wsgi_app`)
and answers exactly that call itself: the same token check and queue scoping (api.auth), the
same body limit, body reader and rules (`ScheduleEventSchema.load_event`), the same store call (so group commit
applies), and the same response, access log line and metrics as the Flask view
(api/events.py `schedule`, api/__init__.py's request hooks).

Anything else goes to Flask, untouched: another path or method, a query string, a prefix
(SCRIPT_NAME), no Content-Length or a body over the limit, tracing (headers or a tracer), a bad
token, a queue the caller cannot see, a body that is not certainly valid or whose data needs the
exact size check. An error of the store call goes to Flask too, with the error handed over in the
environ (`RAISED`): the view raises it where it would have called the store, so every error
response, its log line and its metrics are Flask's, byte for byte, and nothing is written twice.
"""

from __future__ import annotations

import hashlib
import io
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import structlog
from marshmallow import ValidationError
from werkzeug.wrappers import Response as WerkzeugResponse

from tickler.api.jsonio import NotJSON, loads_strict
from tickler.api.metrics import EVENTS_SCHEDULED, HTTP_DURATION, HTTP_REQUESTS
from tickler.api.render import etag, event_json
from tickler.api.schemas.events import ScheduleEventSchema, data_is_certainly_storable
from tickler.scheduler import rules, tracing
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import Queue
from tickler.scheduler.states import Scheduled

if TYPE_CHECKING:
    from flask import Flask

    from tickler.api.context import Tickler

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# The environ key that carries the store call's error to the Flask view (api/events.py).
RAISED = "tickler.lean.raised"
# The route as the access log and the metrics name it (the Flask rule's text).
ROUTE = "/v1/queues/<queue>/events"
_PATH = re.compile(r"/v1/queues/([a-z0-9][a-z0-9_.-]{0,62})/events")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # api/__init__.py's, matched the same way
# Headers whose meaning the lean route does not take on: the request goes to Flask.
_UNUSUAL = ("HTTP_TRACEPARENT", "HTTP_TRACESTATE", "HTTP_TRANSFER_ENCODING", "HTTP_CONTENT_ENCODING")
_STATUS = {code: WerkzeugResponse(status=code).status for code in (200, 202)}
_SAFE = "!$&'()*+,/:;=@"  # werkzeug's BaseConverter.to_url: a path segment's safe characters

log = structlog.get_logger("tickler.http")
_schema = ScheduleEventSchema()


class LeanSchedule:
    """WSGI middleware: the common single-event schedule answered here, the rest by `inner`."""

    def __init__(self, app: Flask, inner: WSGIApp, *, new_request_id: Callable[[], str]) -> None:
        self.app = app
        self.inner = inner
        self.enabled = True
        self.taken = 0  # requests answered here (tests prove the route is taken)
        self._new_request_id = new_request_id
        self._ext: Tickler = app.extensions["tickler"]
        self._limit: int = app.config["MAX_CONTENT_LENGTH"]

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if self.enabled and environ.get("REQUEST_METHOD") == "POST":
            match = _PATH.fullmatch(environ.get("PATH_INFO", ""))
            if match is not None:
                answer = self._answer(environ, match.group(1))
                if answer is not None:
                    status, headers, body = answer
                    start_response(status, headers)
                    return [body]
        return self.inner(environ, start_response)

    def _answer(self, environ: dict[str, Any], queue: str) -> tuple[str, list[tuple[str, str]], bytes] | None:
        """The response, or None when Flask must answer (then the environ is as it came, but for
        a body already read, which is put back, and the store call's error, if any)."""
        if environ.get("QUERY_STRING") or environ.get("SCRIPT_NAME"):
            return None
        if any(name in environ for name in _UNUSUAL) or tracing.enabled():
            return None
        length = environ.get("CONTENT_LENGTH", "")
        if not length.isascii() or not length.isdigit() or int(length) > self._limit:
            return None
        started = time.perf_counter()
        try:  # a database that cannot answer: Flask's error handlers say so
            caller = self._principal(environ.get("HTTP_AUTHORIZATION", ""))
            target = self._queue(queue) if caller is not None and caller.can_use(queue) else None
        except Exception:
            return None
        if caller is None or target is None:
            return None
        ext = self._ext
        events = ext.store.events
        with events.groups.handling():  # as the view: from before the body is read
            raw = environ["wsgi.input"].read(int(length))
            environ["wsgi.input"] = io.BytesIO(raw)  # for Flask, should it answer after all
            if len(raw) != int(length) or not raw.strip():  # cut short: Flask says how
                return None
            try:
                body = loads_strict(raw)
            except NotJSON:
                return None
            if type(body) is not dict:
                return None
            try:
                event, on_conflict, debounce_max = _schema.load_event(body)
            except ValidationError:  # Flask names the errors
                return None
            if not data_is_certainly_storable(raw, ext.settings.max_event_data_bytes):
                return None
            given = environ.get("HTTP_X_REQUEST_ID", "")
            request_id = given if _REQUEST_ID.match(given) else self._new_request_id()
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(request_id=request_id)
            try:
                found, outcome = events.schedule(
                    target, event, actor=caller.name, on_conflict=on_conflict, debounce_max_seconds=debounce_max
                )
            except Exception as error:  # Flask's error handlers answer it
                environ["wsgi.input"].seek(0)
                environ[RAISED] = error
                return None
        EVENTS_SCHEDULED.labels(queue, outcome).inc()
        status = 202 if outcome == Scheduled.CREATED else 200
        # What jsonify writes: the app's JSON provider, compact, and a newline.
        text = (self.app.json.dumps(event_json(found, outcome=outcome), separators=(",", ":")) + "\n").encode()
        location = f"/v1/queues/{queue}/events/{quote(found.item_key, safe=_SAFE)}"
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(text))),
            ("ETag", etag(found)),
            ("Location", location),
            ("X-Request-Id", request_id),
        ]
        elapsed = time.perf_counter() - started
        HTTP_REQUESTS.labels(ROUTE, "POST", str(status)).inc()
        HTTP_DURATION.labels(ROUTE).observe(elapsed)
        log.info(
            "request",
            method="POST",
            path=environ["PATH_INFO"],
            route=ROUTE,
            status=status,
            duration_ms=round(elapsed * 1000, 2),
            principal=caller.name,
        )
        self.taken += 1
        return _STATUS[status], headers, text

    def _principal(self, header: str) -> Any:
        """api.auth.authenticate's check without Flask: the principal, or None (Flask answers 401)."""
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        ext = self._ext
        key = hashlib.sha256(token.encode()).digest()
        found = ext.principals.get(key, lambda: ext.store.tokens.authenticate(token))
        if found is not None:
            ext.token_use.used(key)
        return found

    def _queue(self, name: str) -> Queue | None:
        """api.auth.visible_queue's read without Flask (the name is checked by the path's pattern)."""
        if rules.check_queue_name(name) is not None:
            return None
        ext = self._ext

        def load() -> Queue | None:
            try:
                return ext.store.queues.get(name)
            except NotFound:
                return None

        return ext.queues.get(name, load)
