"""API tokens: created once (shown once), stored as hashes, looked up per request."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tickler.scheduler.db import driver_connection
from tickler.scheduler.models import Principal
from tickler.scheduler.sql import driver_sql, run
from tickler.scheduler.store import audit
from tickler.scheduler.store.base import EngineStore

TOKEN_PREFIX = "tkl_"


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class TokenInfo:
    """What is known of a token once created: never the token itself."""

    id: int
    principal: str
    is_admin: bool
    queues: tuple[str, ...]
    created_on: datetime
    revoked_on: datetime | None
    # When it was last used (to the minute: written at most once a minute); None: not yet.
    last_used_on: datetime | None = None


def described(info: TokenInfo) -> dict[str, Any]:
    """A token as the operations log shows it: its id, name and scope, never the token or its hash."""
    return {"id": info.id, "name": info.principal, "admin": info.is_admin, "queues": list(info.queues)}


def _info(row: Any) -> TokenInfo:
    return TokenInfo(
        row["id"],
        row["principal"],
        row["is_admin"],
        tuple(row["queues"]),
        row["created_on"],
        row["revoked_on"],
        row["last_used_on"],
    )


class TokenStore(EngineStore):
    def create(
        self,
        principal: str,
        *,
        queues: list[str] | tuple[str, ...] = (),
        is_admin: bool = False,
        actor: str = audit.SYSTEM_ACTOR,
    ) -> str:
        """Create a token for `principal`, scoped to `queues` (all queues if admin); return it."""
        return self.issue(principal, queues=queues, is_admin=is_admin, actor=actor)[0]

    def issue(
        self,
        principal: str,
        *,
        queues: list[str] | tuple[str, ...] = (),
        is_admin: bool = False,
        actor: str = audit.SYSTEM_ACTOR,
    ) -> tuple[str, TokenInfo]:
        """Create a token; return it (shown this once) and what is kept of it."""
        token, info = self.issue_once(principal, queues=queues, is_admin=is_admin, issue_key=None, actor=actor)
        assert token is not None  # without an issue key, a token is always made
        return token, info

    def issue_once(
        self,
        principal: str,
        *,
        queues: list[str] | tuple[str, ...] = (),
        is_admin: bool = False,
        issue_key: str | None,
        actor: str = audit.SYSTEM_ACTOR,
    ) -> tuple[str | None, TokenInfo]:
        """Create a token, once per `issue_key`: the first request with a key gets the new token
        and what is kept of it; a repeat gets None and the token that the first one made. The
        operations log records a token made, in the same transaction."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        params = {
            "principal": principal,
            "token_hash": hash_token(token),
            "is_admin": is_admin,
            "queues": sorted(set(queues)),
            "issue_key": issue_key,
        }
        with driver_connection(self.engine, driver_sql("create_token"), params) as conn:
            rows = run(conn, driver_sql("create_token"), params)
            if rows:
                info = _info(rows[0])
                audit.OperationsLog.record(conn, actor=actor, action=audit.TOKEN_CREATED, after=described(info))
                return token, info
        [row] = self.rows("issued_token", {"issue_key": issue_key})
        return None, _info(row)

    def list(self) -> list[TokenInfo]:
        return [_info(row) for row in self.rows("list_tokens")]

    def revoke(self, token_id: int, *, actor: str = audit.SYSTEM_ACTOR) -> TokenInfo | None:
        """Revoke a token (again: no change, and no entry in the operations log); None when there
        is no such token."""
        params = {"id": token_id}
        with driver_connection(self.engine, driver_sql("revoke_token"), params) as conn:
            rows = run(conn, driver_sql("revoke_token"), params)
            if not rows:
                return None
            info = _info(rows[0])
            if rows[0]["newly_revoked"]:
                audit.OperationsLog.record(
                    conn,
                    actor=actor,
                    action=audit.TOKEN_REVOKED,
                    before={**described(info), "revoked_on": None},
                    after={**described(info), "revoked_on": info.revoked_on.isoformat() if info.revoked_on else None},
                )
        return info

    def mark_used(self, token_hash: bytes) -> None:
        """Record that the token of this hash was used now (unless it was within the minute)."""
        self.rows("token_used", {"token_hash": token_hash})

    def authenticate(self, token: str) -> Principal | None:
        rows = self.rows("find_token", {"token_hash": hash_token(token)})
        if not rows:
            return None
        row = rows[0]
        return Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))
