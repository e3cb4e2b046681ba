"""Authentication and authorization: the caller of a request (its bearer token), whether it is an
admin, and which queues it may see (another caller's queue is a 404, as if it did not exist)."""

from __future__ import annotations

import hashlib

from flask import g, request
from werkzeug.exceptions import Forbidden, Unauthorized

from tickler.api.context import tickler
from tickler.scheduler import rules
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import Principal, Queue


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
    ext.token_use.used(key)
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


def history_of_queue(name: str) -> None:
    """Timelines: an admin reads them also for a queue that was deleted (its keys' history stays);
    anyone else needs the queue, as for every other call."""
    if principal().is_admin and rules.check_queue_name(name) is None:
        return
    visible_queue(name)
