"""API tokens: created once (shown once), stored as hashes, looked up per request."""

from __future__ import annotations

import hashlib
import secrets

import sqlalchemy as sa

from scheduler.models import Principal
from scheduler.sql import q

TOKEN_PREFIX = "tkl_"


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def create(self, principal: str, *, queues: list[str] | tuple[str, ...] = (), is_admin: bool = False) -> str:
        """Create a token for `principal`, scoped to `queues` (all queues if admin); return it."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            conn.execute(
                q("create_token"),
                {
                    "principal": principal,
                    "token_hash": hash_token(token),
                    "is_admin": is_admin,
                    "queues": sorted(set(queues)),
                },
            )
        return token

    def authenticate(self, token: str) -> Principal | None:
        with self.engine.connect() as conn:
            row = conn.execute(q("find_token"), {"token_hash": hash_token(token)}).mappings().first()
        if row is None:
            return None
        return Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))
