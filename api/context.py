"""What a view needs from the app: the store, the settings, the caller, and the caller's queues."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from flask import current_app, g, request
from werkzeug.exceptions import Forbidden, Unauthorized

from api.cache import TTLCache
from api.jsonio import NotJSON, loads_strict
from config import Settings
from scheduler import rules
from scheduler.errors import Invalid, NotFound
from scheduler.models import Principal, Queue
from scheduler.store import Store


@dataclass
class Tickler:
    """tickler's state inside one Flask app (one per process)."""

    settings: Settings
    store: Store
    database_url: str
    principals: TTLCache[Principal] = field(init=False)
    queues: TTLCache[Queue] = field(init=False)

    def __post_init__(self) -> None:
        self.principals = TTLCache(self.settings.cache_seconds)
        self.queues = TTLCache(self.settings.cache_seconds)


def tickler() -> Tickler:
    ext: Tickler = current_app.extensions["tickler"]
    return ext


def store() -> Store:
    return tickler().store


def authenticate() -> Principal:
    """The principal of the request's bearer token; 401 without a valid one."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Send 'Authorization: Bearer <token>'.")
    ext = tickler()
    key = hashlib.sha256(token.encode()).digest()
    principal = ext.principals.get(key, lambda: ext.store.tokens.authenticate(token))
    if principal is None:
        raise Unauthorized("The token is not valid.")
    g.principal = principal
    return principal


def require_token() -> None:
    """before_request of /v1: every call needs a valid bearer token."""
    authenticate()


def principal() -> Principal:
    found: Principal = g.principal
    return found


def require_admin() -> Principal:
    caller = principal()
    if not caller.is_admin:
        raise Forbidden("This needs an admin token.")
    return caller


def visible_queue(name: str) -> Queue:
    """The queue, if the caller may use it; otherwise 404, as if it did not exist."""
    if rules.check_queue_name(name) is not None or not principal().can_use(name):
        raise NotFound(f"No queue named {name!r}.")
    ext = tickler()

    def load() -> Queue | None:
        try:
            return ext.store.queues.get(name)
        except NotFound:
            return None

    queue = ext.queues.get(name, load)
    if queue is None:
        raise NotFound(f"No queue named {name!r}.")
    return queue


def json_body() -> dict[str, Any]:
    """The request body as a JSON object (400 when it is not one; 413 past the size limit)."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        raise Invalid("A JSON body is required.", errors={"body": ["A JSON object is required."]})
    try:
        body = loads_strict(raw)
    except NotJSON as error:
        raise Invalid("The body is not valid JSON.", errors={"body": [f"Not valid JSON: {error}."]}) from None
    if not isinstance(body, dict):
        raise Invalid("The body must be a JSON object.", errors={"body": ["Must be a JSON object."]})
    return body


def query_args() -> dict[str, str]:
    """Query parameters, each given at most once."""
    args: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    for key, values in request.args.lists():
        if len(values) > 1:
            repeated[key] = ["Give this parameter once."]
        args[key] = values[-1]
    if repeated:
        raise Invalid("A query parameter was repeated.", errors=repeated)
    return args
