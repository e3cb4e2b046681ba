"""Which server a job reads: the replica of TICKLER_READ_DATABASE_URL when it is close enough (and,
for an archive run, has replayed the run's own selection), else the primary.

The job's writes (the archive ledger, its deletes) always go to the primary; only the Source's
reads move. A replica that cannot be reached, or that stays further behind than the lag allowed,
leaves the reads on the primary: a job never fails for its replica.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import structlog

from tickler.pipeline import db
from tickler.scheduler import sql
from tickler.scheduler.sql import driver_sql

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT = 2
POLL_SECONDS = 0.1


def read_url(primary_url: str, replica_url: str, *, max_lag_seconds: float, after_lsn: str | None = None) -> str:
    """`replica_url` when its lag is within `max_lag_seconds` (and, with `after_lsn`, once it has
    replayed the primary's WAL up to there, waiting at most that long), else `primary_url`."""
    if not replica_url:
        return primary_url
    deadline = time.monotonic() + max_lag_seconds
    try:
        with db.connect(replica_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            while True:
                if _caught_up(conn, max_lag_seconds, after_lsn):
                    log.info("pipeline_reads", on="replica", database=db.endpoint(replica_url).address.display())
                    return replica_url
                if time.monotonic() >= deadline:
                    break
                time.sleep(POLL_SECONDS)  # replay moves on by itself; nothing to be woken by
    except psycopg.OperationalError as error:
        log.warning("pipeline_replica_unreachable", error=str(error).splitlines()[0] if str(error) else "")
        return primary_url
    log.warning("pipeline_reads", on="primary", reason="the replica is too far behind", max_lag_seconds=max_lag_seconds)
    return primary_url


def _caught_up(conn: psycopg.Connection[Any], max_lag_seconds: float, after_lsn: str | None) -> bool:
    [(lag,)] = sql.run(conn, driver_sql("replica_lag"), tuples=True)
    if lag is None or float(lag) > max_lag_seconds:
        return False
    return after_lsn is None or bool(db.rows(conn, "replayed_to", {"lsn": after_lsn})[0]["replayed"])


def primary_lsn(conn: psycopg.Connection[Any]) -> str:
    """Where the primary's WAL is now (db.rows: primary_wal_lsn)."""
    return str(db.rows(conn, "primary_wal_lsn")[0]["lsn"])
