"""API tokens: created once (shown once), stored as hashes, looked up per request."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tickler.scheduler.models import Principal
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


def _info(row: Any) -> TokenInfo:
    return TokenInfo(
        row["id"], row["principal"], row["is_admin"], tuple(row["queues"]), row["created_on"], row["revoked_on"]
    )


class TokenStore(EngineStore):
    def create(self, principal: str, *, queues: list[str] | tuple[str, ...] = (), is_admin: bool = False) -> str:
        """Create a token for `principal`, scoped to `queues` (all queues if admin); return it."""
        return self.issue(principal, queues=queues, is_admin=is_admin)[0]

    def issue(
        self, principal: str, *, queues: list[str] | tuple[str, ...] = (), is_admin: bool = False
    ) -> tuple[str, TokenInfo]:
        """Create a token; return it (shown this once) and what is kept of it."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        params = {
            "principal": principal,
            "token_hash": hash_token(token),
            "is_admin": is_admin,
            "queues": sorted(set(queues)),
        }
        [row] = self.rows("create_token", params)
        return token, _info(row)

    def list(self) -> list[TokenInfo]:
        return [_info(row) for row in self.rows("list_tokens")]

    def revoke(self, token_id: int) -> TokenInfo | None:
        """Revoke a token (again: no change); None when there is no such token."""
        rows = self.rows("revoke_token", {"id": token_id})
        return _info(rows[0]) if rows else None

    def authenticate(self, token: str) -> Principal | None:
        rows = self.rows("find_token", {"token_hash": hash_token(token)})
        if not rows:
            return None
        row = rows[0]
        return Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))
