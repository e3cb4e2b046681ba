"""tickler's HTTP API: a thin Flask skin over the store."""

from __future__ import annotations

import io
import itertools
import os
import re
import time
import uuid
from importlib.metadata import PackageNotFoundError, version

import structlog
from flask import Blueprint, Flask, Response, current_app, g, redirect, request
from prometheus_client import CollectorRegistry
from werkzeug.exceptions import RequestEntityTooLarge

from tickler.api import (
    audit,
    auth,
    context,
    docs,
    erasures,
    events,
    export,
    leases,
    operations,
    ops,
    queues,
    schedules,
    tokens,
    ui,
)
from tickler.api.jsonio import StrictJSONProvider
from tickler.api.metrics import HTTP_DURATION, HTTP_REQUESTS
from tickler.api.openapi import build_spec
from tickler.api.problems import Refusals, register_error_handlers
from tickler.api.render import event_json
from tickler.config import Settings
from tickler.scheduler.db import create_engine, resolve_database_url
from tickler.scheduler.logs import configure_logging
from tickler.scheduler.migrate import migrate
from tickler.scheduler.queue_metrics import QueueGaugeCollector
from tickler.scheduler.replica import ReplicaLagCollector, read_engines
from tickler.scheduler.store import Store
from tickler.scheduler.waiting import PullClaims
from tickler.scheduler.wakeup import WakeupListener

log = structlog.get_logger("tickler.http")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def tickler_version() -> str:
    try:
        return version("tickler")
    except PackageNotFoundError:
        return "0.0.0"


def create_app(settings: Settings | None = None, *, configure_logs: bool = True) -> Flask:
    """Build the API. Engine and pool are made here, so each gunicorn worker gets its own."""
    settings = settings or Settings.from_env()
    if configure_logs:
        configure_logging(settings.log_level, settings.log_format)
    database_url = resolve_database_url(settings.database_url, settings.data_dir)
    if settings.migrate_on_start:
        migrate(database_url, connect_timeout=settings.connect_timeout)
    engine = create_engine(database_url, pool_size=settings.pool_size, connect_timeout=settings.connect_timeout)
    reads = read_engines(engine, settings)
    store = Store(engine, reads)
    store.events.groups.window = settings.group_commit_ms / 1000

    app = Flask("tickler")
    app.json = StrictJSONProvider(app)
    if settings.json == "stdlib":
        app.json.orjson = None
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    ext = context.Tickler(settings=settings, store=store, database_url=database_url)
    app.extensions["tickler"] = ext
    if settings.cache_seconds > 0:
        # Cached tokens and queues are dropped on NOTIFY from any process (a revoked token is
        # refused everywhere at once); the same listener serves the claims' long polls.
        listener = WakeupListener(database_url, connect_timeout=settings.connect_timeout).start()
        app.extensions["tickler.listener"] = listener
        ext.follow(listener)
    app.extensions["tickler.pull"] = PullClaims(
        store,
        database_url,
        listener=app.extensions.get("tickler.listener"),
        connect_timeout=settings.connect_timeout,
    )
    app.extensions["tickler.openapi"] = build_spec(tickler_version(), settings)
    # Per-queue gauges, read from the database at scrape time (its own registry: one per app).
    gauges = CollectorRegistry()
    gauges.register(QueueGaugeCollector(store.queues))
    gauges.register(ReplicaLagCollector(reads))
    app.extensions["tickler.gauges"] = gauges

    app.url_map.converters["item_key"] = events.ItemKeyConverter
    v1 = Blueprint("v1", __name__, url_prefix="/v1")
    v1.before_request(auth.require_token)
    v1.before_request(context.refuse_query_args)
    for resource in (
        events.bp,
        export.bp,
        queues.bp,
        schedules.bp,
        leases.claims_bp,
        leases.leases_bp,
        tokens.bp,
        operations.bp,
        erasures.bp,
        audit.bp,
    ):
        v1.register_blueprint(resource)
    for blueprint in (v1, ops.bp, docs.bp):
        app.register_blueprint(blueprint)
    ui.register(app)
    app.add_url_rule("/", "root", lambda: redirect("/ui/"))  # a person who opens the bare address

    app.extensions["tickler.refusals"] = Refusals()
    register_error_handlers(app, event_json)
    app.before_request(_start_request)
    app.after_request(_finish_request)
    return app


def close_app(app: Flask) -> None:
    """Stop what create_app started: the pull claims' waiters, the LISTEN connection and the
    connection pool. For a program or a test that builds an app and goes on running (a WSGI
    server's process simply exits); without it the listener keeps reconnecting to a database
    that may be gone."""
    app.extensions["tickler.pull"].stop()
    listener = app.extensions.get("tickler.listener")
    if listener is not None:
        listener.stop()
    app.extensions["tickler"].store.dispose()


def _bounded_body() -> None:
    """Hold the body limit when no Content-Length announces the size (chunked transfer).

    werkzeug refuses a Content-Length over MAX_CONTENT_LENGTH, but a chunked body it cuts at the
    limit without a word, and the cut JSON then fails to parse (400 instead of 413). Read such a
    body here, one byte past the limit, and hand the rest of the app the bytes read.
    """
    environ = request.environ
    if request.content_length is not None or "wsgi.input_terminated" not in environ:
        return
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    stream = environ["wsgi.input"]
    body = bytearray()
    while len(body) <= limit:
        chunk = stream.read(min(65536, limit + 1 - len(body)))
        if not chunk:
            break
        body.extend(chunk)
    if len(body) > limit:
        raise RequestEntityTooLarge(f"The request body is over the limit of {limit} bytes.")
    # Still "terminated": werkzeug reads the bytes to their end, within its own limit.
    environ["wsgi.input"] = io.BytesIO(bytes(body))


# A request id made up here: 32 hex digits as uuid4().hex has, without its urandom call per
# request (1.8 % of a single-event schedule's profile): random per process (drawn again in a
# forked child, e.g. gunicorn --preload's workers), then a counter.
_request_ids: list[str | itertools.count[int]] = []


def _new_request_ids() -> None:
    _request_ids[:] = [uuid.uuid4().hex[:16], itertools.count(int.from_bytes(os.urandom(4)))]


_new_request_ids()
os.register_at_fork(after_in_child=_new_request_ids)


def _new_request_id() -> str:
    prefix, counter = _request_ids
    assert isinstance(counter, itertools.count)
    return f"{prefix}{next(counter) & 0xFFFFFFFFFFFFFFFF:016x}"


def _start_request() -> None:
    started = time.perf_counter()
    given = request.environ.get("HTTP_X_REQUEST_ID", "")
    request_id = given if _REQUEST_ID.match(given) else _new_request_id()
    g.request_id, g.started = request_id, started
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    _bounded_body()


def _finish_request(response: Response) -> Response:
    elapsed = time.perf_counter() - g.get("started", time.perf_counter())
    route = request.url_rule.rule if request.url_rule is not None else "unmatched"
    HTTP_REQUESTS.labels(route, request.method, str(response.status_code)).inc()
    HTTP_DURATION.labels(route).observe(elapsed)
    response.headers["X-Request-Id"] = g.get("request_id", "")
    caller = g.get("principal")
    log.info(
        "request",
        method=request.method,
        path=request.path,
        route=route,
        status=response.status_code,
        duration_ms=round(elapsed * 1000, 2),
        principal=caller.name if caller else None,
    )
    return response
