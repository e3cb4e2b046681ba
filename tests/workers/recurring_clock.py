"""A process that runs the recurring-schedule engine over a simulated time range (tests only).

    python -m tests.workers.recurring_clock DATABASE_URL START END STEP_SECONDS

Prints "ready", waits for a line on stdin (so that every process starts together), then for each
simulated instant: enqueue due occurrences, and deliver (finish) the events that came due — so
that their keys are free again and only the schedules' cursors stand between an occurrence and
its second enqueue. Prints the number of events it enqueued.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

import sqlalchemy as sa

from tickler.scheduler.db import create_engine
from tickler.scheduler.recurring import enqueue_due
from tickler.scheduler.rules import parse_rfc3339

_DELIVER = sa.text(
    """
    UPDATE tickler_event SET dequeued_on = :now, dequeued_by = 'clock', outcome = 'delivered'
    WHERE id IN (SELECT id FROM tickler_event WHERE dequeued_on IS NULL AND schedule_on <= :now
                 FOR UPDATE SKIP LOCKED)
    """
)


def main(url: str, start: datetime, end: datetime, step: timedelta) -> None:
    engine = create_engine(url, pool_size=1)
    print("ready", flush=True)
    sys.stdin.readline()
    enqueued = 0
    now = start
    while now <= end:
        enqueued += enqueue_due(engine, now=now)
        with engine.begin() as conn:
            conn.execute(_DELIVER, {"now": now})
        now += step
    engine.dispose()
    print(enqueued, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], parse_rfc3339(sys.argv[2]), parse_rfc3339(sys.argv[3]), timedelta(seconds=float(sys.argv[4])))
