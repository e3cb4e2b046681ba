"""What the dashboard (/ui/) reads: queue overviews, per-minute rates, live leases, its session key.

Its SQL lives in `dashboard.sql` beside this module (named blocks, loaded once).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any

import sqlalchemy as sa

from tickler.scheduler.models import Principal
from tickler.scheduler.sql import parse_queries
from tickler.scheduler.store.base import EngineStore
from tickler.scheduler.store.tokens import hash_token


@cache
def _queries() -> dict[str, sa.TextClause]:
    source = resources.files("tickler.scheduler.store").joinpath("dashboard.sql").read_text(encoding="utf-8")
    return {name: sa.text(sql) for name, sql in parse_queries(source).items()}


def _q(name: str) -> sa.TextClause:
    return _queries()[name]


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
        with self.engine.begin() as conn:
            # A handful of index probes per queue, but the planner's estimate for the subqueries
            # (taken per queue, over a table it may not have analysed) can pass the JIT threshold,
            # and compiling the plan then costs a second or more: never worth it here.
            conn.execute(_q("no_jit"))
            rows = conn.execute(_q("overview"), params).mappings().all()
            minutes = conn.execute(_q("minutes"), params).mappings().all()
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
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            rows = conn.execute(_q("live_leases"), {"names": names, "limit": limit, "now": now}).mappings().all()
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
        with self.autocommit.connect() as conn:  # reads: no BEGIN / ROLLBACK
            row = conn.execute(_q("principal_by_hash"), {"token_hash": token_hash}).mappings().first()
        if row is None:
            return None
        return Principal(name=row["principal"], is_admin=row["is_admin"], queues=frozenset(row["queues"]))

    @staticmethod
    def token_hash(token: str) -> bytes:
        return hash_token(token)

    def session_secret(self) -> str:
        """The key that signs dashboard sessions: created once, then the same for every process."""
        with self.engine.begin() as conn:
            conn.execute(_q("create_ui_secret"), {"secret": secrets.token_urlsafe(48)})
            return str(conn.execute(_q("get_ui_secret")).scalar_one())


def _series(by_minute: dict[datetime, tuple[int, int]], now: datetime) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The 60 minutes ending with the current one, oldest first; minutes with nothing are 0."""
    current = now.replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=59 - i) for i in range(60)]
    delivered = tuple(by_minute.get(m, (0, 0))[0] for m in minutes)
    failed = tuple(by_minute.get(m, (0, 0))[1] for m in minutes)
    return delivered, failed
