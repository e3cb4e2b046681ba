"""The transactional outbox: schedule, move and cancel tickler events *if and only if* your own
PostgreSQL transaction commits.

Write the call into the `tickler_outbox` table of your database, in the transaction that makes
the change it belongs to; a relay (`Relay(...).run()` or `tickler-outbox relay`) forwards
committed rows to tickler in batches, in order per key, and deletes them once tickler answered.
A rolled-back transaction schedules nothing; a relay killed at any point loses and repeats
nothing (see `forward.py` for how a resend is made harmless). Needs `tickler-client[outbox]`.

>>> from tickler_client import outbox
>>> outbox.install(conn)  # once: creates the tables (schema.sql)
>>> with conn.transaction():
...     conn.execute("UPDATE account SET plan = 'pro' WHERE id = %s", [account_id])
...     outbox.schedule(conn, "emails", f"upsell:{account_id}", {"plan": "pro"}, delay=timedelta(days=3))
...     outbox.cancel(conn, "emails", f"trial-ending:{account_id}")

`conn` is a psycopg 3 (or psycopg2) connection or a SQLAlchemy `Connection`
(`session.connection()` for an ORM session).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tickler_client.outbox._sql import SCHEMA_SQL, run_script
from tickler_client.outbox._write import cancel, reschedule, schedule
from tickler_client.outbox.forward import Row

if TYPE_CHECKING:
    from tickler_client.outbox.relay import Relay, RelayStats


def install(conn: Any) -> None:
    """Create the outbox's tables and index in the caller's transaction (commit it); running it
    again changes nothing. The same statements are in `SCHEMA_SQL` (schema.sql), for your own
    migrations."""
    run_script(conn, SCHEMA_SQL)


def __getattr__(name: str) -> Any:
    # The relay needs psycopg (the `outbox` extra); writing rows does not: import it on first use.
    if name in ("Relay", "RelayStats"):
        from tickler_client.outbox import relay

        return getattr(relay, name)
    raise AttributeError(name)


__all__ = ["SCHEMA_SQL", "Relay", "RelayStats", "Row", "cancel", "install", "reschedule", "schedule"]
