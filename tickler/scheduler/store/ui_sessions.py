"""Dashboard sessions kept on the server: started at sign-in, ended at sign-out or at a fixed
time that activity does not move (SPEC §7). SQL in `ui_sessions.sql` beside this module."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from tickler.scheduler.db import driver_connection, driver_rows
from tickler.scheduler.models import Principal
from tickler.scheduler.sql import run
from tickler.scheduler.store.audit import ADMIN_SIGNED_IN, OperationsLog
from tickler.scheduler.store.base import EngineStore, sql_file
from tickler.scheduler.store.tokens import hash_token

_sql = sql_file("ui_sessions.sql")


@dataclass(frozen=True)
class LiveSession:
    principal: Principal
    expires_on: datetime
    token_id: int | None = None  # the token the session was started with


class SessionStore(EngineStore):
    def start(self, token: str, *, lifetime_seconds: float, admin: str | None = None) -> tuple[str, datetime]:
        """A new session for `token`; returns its id (for the cookie only) and when it ends. An
        admin's sign-in (`admin`: its name) is an entry of the operations log, written with it."""
        session_id = secrets.token_urlsafe(32)
        # Kept as a token is, by its hash only: the table alone signs no one in.
        params = {
            "id_hash": hash_token(session_id),
            "token_hash": hash_token(token),
            "lifetime_seconds": lifetime_seconds,
        }
        with driver_connection(self.engine, _sql("start_ui_session"), params) as conn:
            [[expires_on]] = run(conn, _sql("start_ui_session"), params, tuples=True)
            if admin is not None:
                OperationsLog.record(conn, actor=admin, action=ADMIN_SIGNED_IN)
        return session_id, expires_on

    def find(self, session_id: str) -> LiveSession | None:
        """The live session with this id (None: unknown, ended, run out, or its token revoked)."""
        rows = driver_rows(self.engine, _sql("ui_session_principal"), {"id_hash": hash_token(session_id)})
        if not rows:
            return None
        row = rows[0]
        principal = Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))
        return LiveSession(principal, row["expires_on"], row["token_id"])

    def end(self, session_id: str) -> None:
        driver_rows(self.engine, _sql("end_ui_session"), {"id_hash": hash_token(session_id)})
