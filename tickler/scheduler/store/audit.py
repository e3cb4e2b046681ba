"""The operations log (SPEC §7): every change to how tickler runs — queues created, changed, paused,
resumed and deleted; tokens created and revoked; erasures requested; an admin's dashboard
sign-in — with who, when, and the values before and after. An entry is written by `record` on the
connection of the change, in its transaction: the change and its entry commit together or not at
all. Entries never hold a secret or a token (a token's entries name its id, name and scope).
SQL in `audit.sql` beside this module."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tickler.scheduler.db import driver_connection, driver_rows
from tickler.scheduler.models import Queue
from tickler.scheduler.sql import rowcount, run
from tickler.scheduler.store.base import EngineStore, sql_file

# Every action an entry may name (the API's `action` filter accepts these only).
QUEUE_CREATED = "queue.created"
QUEUE_CHANGED = "queue.changed"
QUEUE_PAUSED = "queue.paused"
QUEUE_RESUMED = "queue.resumed"
QUEUE_DELETED = "queue.deleted"
TOKEN_CREATED = "token.created"
TOKEN_REVOKED = "token.revoked"
ERASURE_REQUESTED = "erasure.requested"
ADMIN_SIGNED_IN = "dashboard.signed_in"
ACTIONS = (
    QUEUE_CREATED,
    QUEUE_CHANGED,
    QUEUE_PAUSED,
    QUEUE_RESUMED,
    QUEUE_DELETED,
    TOKEN_CREATED,
    TOKEN_REVOKED,
    ERASURE_REQUESTED,
    ADMIN_SIGNED_IN,
)

# Who changed something when no person did (a command run on the server, a test).
SYSTEM_ACTOR = "system"

# Days the log keeps its entries unless TICKLER_AUDIT_RETENTION_DAYS says otherwise.
DEFAULT_RETENTION_DAYS = 365

# A queue's fields an entry never shows: its secrets, and what changes by itself (timestamps).
_NOT_LOGGED = frozenset(
    {"signing_secret", "previous_signing_secret", "previous_secret_until", "created_on", "updated_on"}
)


_sql = sql_file("audit.sql")


@dataclass(frozen=True)
class Entry:
    id: int
    at: datetime
    actor: str
    action: str
    queue: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(frozen=True)
class EntryFilter:
    """What a page of the log is limited to (None: any); `before_id`: the entries older than that one."""

    queue: str | None = None
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    before_id: int | None = None


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def safe_url(url: str | None) -> str | None:
    """A webhook URL as an entry shows it: without the credentials or the query it may carry."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "…" if parts.query else "", ""))


def queue_settings(queue: Queue) -> dict[str, Any]:
    """A queue's settings as entries show them: no secret, no timestamps, the URL made safe."""
    values = {f.name: getattr(queue, f.name) for f in fields(Queue) if f.name not in _NOT_LOGGED}
    values["webhook_url"] = safe_url(values["webhook_url"])
    return values


def changed_settings(before: Queue, after: Queue) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings that differ, as they were and as they are; a new signing secret is named, not shown."""
    old, new = queue_settings(before), queue_settings(after)
    keys = [key for key in new if old.get(key) != new[key]]
    was, now = {key: old.get(key) for key in keys}, {key: new[key] for key in keys}
    if before.signing_secret != after.signing_secret and after.signing_secret is not None:
        was["signing_secret"], now["signing_secret"] = "(previous)", "(rotated)"
    return was, now


class OperationsLog(EngineStore):
    @staticmethod
    def record(
        conn: psycopg.Connection[Any],
        *,
        actor: str,
        action: str,
        queue: str | None = None,
        before: Mapping[str, Any] | None = None,
        after: Mapping[str, Any] | None = None,
    ) -> int:
        """Write one entry on `conn`, in its transaction (commit is the caller's); returns its id.
        `before` and `after` are what changed, as JSON objects: never put a secret in them."""
        if action not in ACTIONS:
            raise ValueError(f"not an action of the operations log: {action!r}")
        params = {"actor": actor, "action": action, "queue": queue, "before": _json(before), "after": _json(after)}
        [row] = run(conn, _sql("record_operation"), params)
        return int(row["id"])

    def page(self, where: EntryFilter, *, limit: int) -> list[Entry]:
        """Up to `limit` entries matching `where`, newest first."""
        params = {
            "queue": where.queue,
            "actor": where.actor,
            "action": where.action,
            "since": where.since,
            "before_id": where.before_id,
            "limit": limit,
        }
        return [Entry(**row) for row in driver_rows(self.engine, _sql("operation_log_page"), params)]

    def prune(self, retention_days: int, *, now: datetime | None = None) -> int:
        """Drop the entries older than `retention_days`; returns how many went."""
        params = {"days": retention_days, "now": now}
        with driver_connection(self.engine, _sql("prune_operation_log"), params) as conn:
            return rowcount(conn, _sql("prune_operation_log"), params)
