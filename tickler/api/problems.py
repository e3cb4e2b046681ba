"""Errors as RFC 9457 problem details, mapped from domain errors in one place."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy.exc
import structlog
from flask import Flask, Response, json
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException

from tickler.scheduler import errors
from tickler.scheduler.db import unavailable_reason
from tickler.scheduler.store.search import BadCursor

log = structlog.get_logger(__name__)

PROBLEM_TYPE_BASE = "https://tickler.dev/problems/"

# domain error -> (status, type slug, title)
_DOMAIN_ERRORS: dict[type[errors.TicklerError], tuple[int, str, str]] = {
    errors.NotFound: (404, "not-found", "Not found"),
    errors.Archived: (404, "archived", "The key's events were archived"),
    errors.KeyConflict: (409, "key-conflict", "An open event already has this key"),
    errors.InFlight: (409, "in-flight", "The event is in flight"),
    errors.QueueInUse: (409, "queue-in-use", "The queue is in use"),
    errors.StaleLease: (409, "stale-lease", "The lease is no longer held"),
    errors.StaleVersion: (412, "stale-version", "The event has changed"),
    errors.TooLarge: (413, "too-large", "Payload too large"),
    errors.Invalid: (400, "validation", "The request is not valid"),
}


_UNAVAILABLE_DETAILS = {
    "unreachable": "The database cannot be reached; try again shortly.",
    "read_only": "The database is read-only for now (a failover, or writes turned off); try again shortly.",
    "disk_full": "The database's disk is full; try again once space is freed.",
    "schema_changed": "The database's schema changed under this request (a migration); try again.",
    "too_many_connections": "The database has no connection to spare; try again shortly.",
    "busy": "Every database connection of this process is busy; try again shortly.",
}


class Refusals:
    """The database's last refusal for a reason no cheap probe can see (a full disk, no memory),
    so that /readyz says not ready for `window_seconds` after it."""

    REMEMBERED = frozenset({"disk_full", "out_of_memory"})

    def __init__(self, window_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_seconds = window_seconds
        self._clock = clock
        self._last: tuple[float, str] | None = None

    def note(self, reason: str) -> None:
        if reason in self.REMEMBERED:
            self._last = (self._clock(), reason)

    def recent(self) -> str | None:
        last = self._last
        if last is None or self._clock() - last[0] > self.window_seconds:
            return None
        return last[1]


def problem(status: int, title: str, detail: str, *, slug: str | None = None, **extra: Any) -> Response:
    body = {
        "type": PROBLEM_TYPE_BASE + slug if slug else "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        **extra,
    }
    response = Response(json.dumps(body), status=status, mimetype="application/problem+json")
    return response


def flatten_errors(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages as {"events[3].item_key": [...], "data": [...]}."""
    flat: dict[str, list[str]] = {}
    if isinstance(messages, dict):
        for key, value in messages.items():
            if isinstance(key, int):
                path = f"{prefix}[{key}]"
            elif key == "_schema":
                path = prefix or "body"
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            for sub_path, sub_messages in flatten_errors(value, path).items():
                flat.setdefault(sub_path, []).extend(sub_messages)
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        flat[prefix or "body"] = list(messages)
    elif isinstance(messages, list):
        for item in messages:
            for sub_path, sub_messages in flatten_errors(item, prefix).items():
                flat.setdefault(sub_path, []).extend(sub_messages)
    else:
        flat[prefix or "body"] = [str(messages)]
    return flat


def validation_problem(messages: Any, detail: str = "The request is not valid.") -> Response:
    return problem(400, "The request is not valid", detail, slug="validation", errors=flatten_errors(messages))


def register_error_handlers(app: Flask, event_json: Any) -> None:
    """Every error leaves as problem+json; `event_json` renders an event carried by an error."""

    @app.errorhandler(errors.TicklerError)
    def _domain(error: errors.TicklerError) -> Response:
        status, slug, title = _DOMAIN_ERRORS.get(type(error), (400, "bad-request", "Bad request"))
        extra: dict[str, Any] = {}
        if "errors" in error.extra:
            extra["errors"] = error.extra["errors"]
        if "archived" in error.extra:
            extra["archived"] = error.extra["archived"]
        if "lease_status" in error.extra:
            extra["lease_status"] = error.extra["lease_status"]
        if "event" in error.extra:
            extra["event"] = event_json(error.extra["event"])
        return problem(status, title, error.detail, slug=slug, **extra)

    @app.errorhandler(ValidationError)
    def _validation(error: ValidationError) -> Response:
        return validation_problem(error.messages)

    @app.errorhandler(BadCursor)
    def _cursor(error: BadCursor) -> Response:
        return validation_problem({"cursor": [str(error)]})

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException) -> Response:
        status = error.code or 500
        response = problem(status, error.name, error.description or error.name)
        valid_methods = getattr(error, "valid_methods", None)
        if status == 405 and valid_methods:
            response.headers["Allow"] = ", ".join(valid_methods)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="tickler"'
        return response

    @app.errorhandler(sqlalchemy.exc.DataError)
    @app.errorhandler(sqlalchemy.exc.IntegrityError)
    def _refused_by_database(error: sqlalchemy.exc.DBAPIError) -> Response:
        diag = getattr(error.orig, "diag", None)
        if getattr(diag, "constraint_name", None) == "tickler_event_queue":
            # The queue was deleted after this process last read it (queues are cached briefly).
            return problem(404, "Not found", "No such queue (it was deleted).", slug="not-found")
        if getattr(diag, "constraint_name", None) == "tickler_event_group_fairness":
            # Migration 0045: the open events of a group share one fairness key (SPEC §10).
            return validation_problem(
                {"fairness_key": ["The open events of this group have another fairness_key; a group has one."]},
                "The events of one group share one fairness_key.",
            )
        # Validation should have caught this; the database is the last line. Still a client
        # value, so a 400 and nothing written (the transaction rolled back).
        log.warning("value_refused_by_database", error=str(error.orig))
        return problem(
            400, "The request is not valid", "The database refused a value of this request.", slug="validation"
        )

    @app.errorhandler(sqlalchemy.exc.DBAPIError)
    @app.errorhandler(sqlalchemy.exc.TimeoutError)  # the pool's wait for a free connection ran out
    @app.errorhandler(psycopg.Error)
    def _database_unavailable(error: Exception) -> Response:
        reason = unavailable_reason(error)
        if reason is None:
            return _unexpected(error)
        log.error("database_unavailable", reason=reason, error=str(getattr(error, "orig", None) or error).strip())
        refusals: Refusals | None = app.extensions.get("tickler.refusals")
        if refusals is not None:
            refusals.note(reason)
        detail = _UNAVAILABLE_DETAILS.get(reason, "The database cannot serve this request now; try again shortly.")
        response = problem(503, "Service unavailable", detail, slug="database-unavailable")
        response.headers["Retry-After"] = "1"
        return response

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        log.exception("unhandled_error")
        return problem(500, "Internal server error", "Something went wrong on tickler's side; it was logged.")
