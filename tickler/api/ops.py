"""Operations endpoints, outside /v1 and without a token: health, readiness, metrics, OpenAPI."""

from __future__ import annotations

import hmac

import psycopg
import sqlalchemy.exc
from flask import Blueprint, Response, current_app, jsonify, request

from tickler.api import context
from tickler.api.metrics import metrics_response
from tickler.api.problems import Refusals, problem
from tickler.scheduler.migrate import MigrationError, pending_migrations, pending_summary

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    ext = context.tickler()
    try:
        refuses = ext.store.refuses_writes()
        # an upgrade migrates first
        pending = pending_migrations(ext.database_url, allow_newer=True, connect_timeout=ext.settings.connect_timeout)
    except (sqlalchemy.exc.DBAPIError, sqlalchemy.exc.TimeoutError, psycopg.Error, OSError) as error:
        return problem(503, "Not ready", f"The database cannot be reached: {type(error).__name__}.")
    except MigrationError as error:
        return problem(503, "Not ready", str(error))
    if pending:
        return problem(503, "Not ready", f"Migrations not applied yet: {pending_summary(pending)}.")
    if refuses is not None:
        return problem(503, "Not ready", f"The database refuses writes ({refuses}): reads work, writes answer 503.")
    refusals: Refusals = current_app.extensions["tickler.refusals"]
    recent = refusals.recent()
    if recent is not None:
        return problem(
            503, "Not ready", f"The database refused a write {refusals.window_seconds:g} s ago or less ({recent})."
        )
    return jsonify({"status": "ready"})


@bp.get("/metrics")
def metrics() -> Response:
    token = context.tickler().settings.metrics_token
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            response = problem(401, "Unauthorized", "/metrics needs the metrics token.")
            response.headers["WWW-Authenticate"] = 'Bearer realm="tickler-metrics"'
            return response
    return metrics_response(current_app.extensions.get("tickler.gauges"))


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(current_app.extensions["tickler.openapi"])
