"""A process that keeps history maintenance busy until it is killed: each round writes a batch of
finished events dated on a day that has no partition yet (they land in the DEFAULT partition),
then runs a maintenance pass, which makes that day and moves the batch into it. Used to kill -9 it
in the middle of a pass (tests/test_history_crash.py).

    python -m tests.workers.maintaining DATABASE_URL QUEUE BATCH
"""

from __future__ import annotations

import sys

import psycopg
import sqlalchemy as sa

from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.store import Store

# The first day written, counted from today (UTC): far past the days a pass makes ahead of time
# and the days other tests make.
FIRST_DAY = 3000

WRITE_BATCH = """
INSERT INTO tickler_event_history
    (id, queue, item_key, schedule_on, enqueued_by, max_attempts, dequeued_on, dequeued_by, outcome)
SELECT n, %(queue)s, 'k' || n, day, 'app', 3, day + interval '1 hour', 'w',
       CASE WHEN n %% 5 = 0 THEN 'dead' ELSE 'delivered' END
FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(batch)s - 1) AS n,
     (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
             + make_interval(days => %(day)s) AS day) AS d
"""


def main(url: str, queue: str, batch: int) -> None:
    store = Store(create_engine(url, pool_size=1))
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        # carry on after the rounds a killed process committed: ids and days follow on
        (written,) = conn.execute("SELECT count(*) FROM tickler_event_history WHERE queue = %s", [queue]).fetchone()  # type: ignore[misc]
        round_ = written // batch
        while True:
            params = {"queue": queue, "first": round_ * batch, "batch": batch, "day": FIRST_DAY + round_}
            conn.execute(WRITE_BATCH, params)
            while not maintained(store):
                pass
            round_ += 1


def maintained(store: Store) -> bool:
    """One maintenance pass; False when it gave up waiting for a lock, as the dispatcher's pass
    gives up and runs again later (the backend of a killed process holds its locks until the
    server notices it is gone)."""
    try:
        store.history.maintain(days_ahead=1)
    except sa.exc.OperationalError as error:
        if not isinstance(error.orig, psycopg.errors.LockNotAvailable):
            raise
        return False
    return True


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
