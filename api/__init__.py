"""tickler's HTTP API: a thin Flask skin over the store."""

from __future__ import annotations

import re
import time
import uuid
from importlib.metadata import PackageNotFoundError, version

import structlog
from flask import Blueprint, Flask, Response, g, request

from api import context, events, leases, ops, queues, tokens
from api.jsonio import StrictJSONProvider
from api.metrics import HTTP_DURATION, HTTP_REQUESTS
from api.openapi import build_spec
from api.problems import register_error_handlers
from api.render import event_json
from config import Settings
from scheduler.db import create_engine, resolve_database_url
from scheduler.logs import configure_logging
from scheduler.migrate import migrate
from scheduler.store import Store

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
        configure_logging(settings.log_level)
    database_url = resolve_database_url(settings.database_url, settings.data_dir)
    if settings.migrate_on_start:
        migrate(database_url)
    store = Store(create_engine(database_url, pool_size=settings.pool_size))

    app = Flask("tickler")
    app.json = StrictJSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["tickler"] = context.Tickler(settings=settings, store=store, database_url=database_url)
    app.extensions["tickler.openapi"] = build_spec(tickler_version())

    v1 = Blueprint("v1", __name__, url_prefix="/v1")
    v1.before_request(context.require_token)
    v1.register_blueprint(events.bp)
    v1.register_blueprint(queues.bp)
    v1.register_blueprint(leases.claims_bp)
    v1.register_blueprint(leases.leases_bp)
    v1.register_blueprint(tokens.bp)
    app.register_blueprint(v1)
    app.register_blueprint(ops.bp)

    register_error_handlers(app, event_json)
    app.before_request(_start_request)
    app.after_request(_finish_request)
    return app


def _start_request() -> None:
    given = request.headers.get("X-Request-Id", "")
    g.request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
    g.started = time.perf_counter()
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=g.request_id)


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
