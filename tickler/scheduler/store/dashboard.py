"""What the dashboard (/ui/) reads: queue overviews, per-minute rates, live leases, its session key.

Its SQL lives in `dashboard.sql` beside this module (named blocks, loaded once), run with sql.run.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tickler.scheduler.db import driver_connection, driver_rows
from tickler.scheduler.models import Principal
from tickler.scheduler.sql import run
from tickler.scheduler.store.base import EngineStore, sql_file
from tickler.scheduler.store.tokens import hash_token

_sql = sql_file("dashboard.sql")


@dataclass(frozen=True)
class QueueOverview:
    name: str
    delivery_mode: str
    paused: bool
    max_in_flight: int | None
    rate_per_second: float | None
    counts: dict[str, int]
    # The oldest open event whose time has come and that no live lease holds (None: nothing due).
    oldest_due: datetime | None
    now: datetime
    # Deliveries and failed attempts in each of the last 60 minutes, oldest first.
    delivered_per_minute: tuple[int, ...] = ()
    failed_per_minute: tuple[int, ...] = ()

    @property
    def oldest_due_seconds(self) -> float | None:
        return None if self.oldest_due is None else max(0.0, (self.now - self.oldest_due).total_seconds())


@dataclass(frozen=True)
class LiveLease:
    lease_id: str
    queue: str
    claimed_by: str
    claimed_on: datetime
    expires_on: datetime
    group_key: str | None
    events: int
    first_key: str
    redeliver_count: int


class DashboardStore(EngineStore):
    def overview(self, names: list[str] | None, *, now: datetime | None = None) -> list[QueueOverview]:
        """Every queue (None) or the named ones, with counts, oldest due time and the last hour's rates."""
        params: dict[str, Any] = {"names": names, "now": now}

        def read(engine: sa.Engine) -> tuple[list[Any], list[Any]]:
            with driver_connection(engine, _sql("overview"), params) as conn:
                # A handful of index probes per queue, but the planner's estimate for the subqueries
                # (taken per queue, over a table it may not have analysed) can pass the JIT threshold,
                # and compiling the plan then costs a second or more: never worth it here.
                run(conn, _sql("no_jit"))
                return run(conn, _sql("overview"), params), run(conn, _sql("minutes"), params)

        rows, minutes = self.reads.read(read)  # counts and charts may lag (a replica)
        per_queue: dict[str, dict[datetime, tuple[int, int]]] = {}
        for m in minutes:
            per_queue.setdefault(m["queue"], {})[m["minute"]] = (int(m["delivered"]), int(m["failed"]))
        result = []
        for row in rows:
            in_flight = int(row["in_flight"])
            counts = {
                "pending": int(row["open"]) - in_flight,
                "due": int(row["due"]),
                "in_flight": in_flight,
                "delivered": int(row["delivered"]),
                "cancelled": int(row["cancelled"]),
                "dead": int(row["dead"]),
            }
            delivered, failed = _series(per_queue.get(row["name"], {}), row["now"])
            result.append(
                QueueOverview(
                    name=row["name"],
                    delivery_mode=row["delivery_mode"],
                    paused=bool(row["paused"]),
                    max_in_flight=row["max_in_flight"],
                    rate_per_second=row["rate_per_second"],
                    counts=counts,
                    oldest_due=row["oldest_due"],
                    now=row["now"],
                    delivered_per_minute=delivered,
                    failed_per_minute=failed,
                )
            )
        return result

    def live_leases(self, names: list[str] | None, *, limit: int = 500, now: datetime | None = None) -> list[LiveLease]:
        """Leases in flight (at most `limit`), oldest claim first."""
        params = {"names": names, "limit": limit, "now": now}
        rows = self.reads.read(lambda engine: driver_rows(engine, _sql("live_leases"), params))
        return [
            LiveLease(
                lease_id=str(row["lease_id"]),
                queue=row["queue"],
                claimed_by=row["claimed_by"],
                claimed_on=row["claimed_on"],
                expires_on=row["expires_on"],
                group_key=row["group_key"],
                events=int(row["events"]),
                first_key=row["first_key"],
                redeliver_count=int(row["redeliver_count"]),
            )
            for row in rows
        ]

    def principal_by_hash(self, token_hash: bytes) -> Principal | None:
        """The principal of a token known by its hash (what a dashboard session keeps), unless revoked."""
        rows = driver_rows(self.engine, _sql("principal_by_hash"), {"token_hash": token_hash})
        if not rows:
            return None
        row = rows[0]
        return Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))

    @staticmethod
    def token_hash(token: str) -> bytes:
        return hash_token(token)

    def session_secret(self) -> str:
        """The key that signs dashboard sessions: created once, then the same for every process."""
        with driver_connection(self.engine, _sql("create_ui_secret")) as conn:
            run(conn, _sql("create_ui_secret"), {"secret": secrets.token_urlsafe(48)})
            [[secret]] = run(conn, _sql("get_ui_secret"), tuples=True)
        return str(secret)


def _series(by_minute: dict[datetime, tuple[int, int]], now: datetime) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The 60 minutes ending with the current one, oldest first; minutes with nothing are 0."""
    current = now.replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=59 - i) for i in range(60)]
    delivered = tuple(by_minute.get(m, (0, 0))[0] for m in minutes)
    failed = tuple(by_minute.get(m, (0, 0))[1] for m in minutes)
    return delivered, failed
