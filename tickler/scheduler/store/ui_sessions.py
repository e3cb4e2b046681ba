"""Dashboard sessions kept on the server: started at sign-in, ended at sign-out or at a fixed
time that activity does not move (SPEC §7). SQL in `ui_sessions.sql` beside this module."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources

import sqlalchemy as sa

from tickler.scheduler.models import Principal
from tickler.scheduler.sql import parse_queries
from tickler.scheduler.store.base import EngineStore
from tickler.scheduler.store.tokens import hash_token


@cache
def _queries() -> dict[str, sa.TextClause]:
    source = resources.files("tickler.scheduler.store").joinpath("ui_sessions.sql").read_text(encoding="utf-8")
    return {name: sa.text(sql) for name, sql in parse_queries(source).items()}


def _id_hash(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


@dataclass(frozen=True)
class LiveSession:
    principal: Principal
    expires_on: datetime


class SessionStore(EngineStore):
    def start(self, token: str, *, lifetime_seconds: float) -> tuple[str, datetime]:
        """A new session for `token`; returns its id (for the cookie only) and when it ends."""
        session_id = secrets.token_urlsafe(32)
        params = {
            "id_hash": _id_hash(session_id),
            "token_hash": hash_token(token),
            "lifetime_seconds": lifetime_seconds,
        }
        with self.engine.begin() as conn:
            expires_on: datetime = conn.execute(_queries()["start_ui_session"], params).scalar_one()
        return session_id, expires_on

    def find(self, session_id: str) -> LiveSession | None:
        """The live session with this id (None: unknown, ended, run out, or its token revoked)."""
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            row = conn.execute(_queries()["ui_session_principal"], {"id_hash": _id_hash(session_id)}).mappings().first()
        if row is None:
            return None
        principal = Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))
        return LiveSession(principal, row["expires_on"])

    def end(self, session_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(_queries()["end_ui_session"], {"id_hash": _id_hash(session_id)})
