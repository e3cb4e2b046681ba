"""What the database was doing, twice a second, while a long scenario ran: to tell what a stall was.

The soak's lateness can hold for most of an hour and then jump for a few seconds. The per-minute
figures cannot say why; this watch keeps, every half second, the checkpointer's and the autovacuum
workers' activity, the vacuums in progress and every statement of the database running for longer
than half a second (with what it waits on), so that the report can show the seconds around a stall.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from bench.cpu import proc_cpu

LOOK = """
SELECT extract(epoch FROM clock_timestamp())::float8,
       (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
       (SELECT coalesce(wait_event, 'on CPU') FROM pg_stat_activity WHERE backend_type = 'checkpointer'),
       (SELECT string_agg(CAST(relid AS regclass)::text || ' ' || phase, ', ') FROM pg_stat_progress_vacuum),
       (SELECT string_agg(format('%s %s %s ms: %s', backend_type,
                                 coalesce(wait_event_type || '/' || wait_event, 'on CPU'),
                                 round(1000 * extract(epoch FROM clock_timestamp() - query_start)),
                                 left(regexp_replace(query, '\\s+', ' ', 'g'), 70)), ' | ')
        FROM pg_stat_activity
        WHERE pid <> pg_backend_pid() AND state = 'active'
          AND (backend_type = 'autovacuum worker'
               OR (datname = current_database() AND clock_timestamp() - query_start > interval '0.5 s')))
"""


class StallWatch:
    """Samples LOOK every `interval` seconds on a thread of its own until stopped."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        self.url = url
        self.interval = interval
        self.samples: list[tuple[float, int, str, str | None, str | None, float]] = []
        self.pids: list[int] = []  # processes whose CPU time each sample records (the worker)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="tickler-bench-stall-watch") as conn:
            while not self._stop.is_set():
                started = time.monotonic()
                row = conn.execute(LOOK).fetchone()
                if row is not None:
                    cpu = sum(proc_cpu(pid) or 0.0 for pid in self.pids)
                    self.samples.append((*row, cpu))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def around(self, start: float, end: float, margin: float = 3.0) -> list[str]:
        """The samples from `margin` seconds before `start` to `margin` after `end` (epoch seconds),
        one line each: time, the followed processes' CPU seconds since the sample before, checkpoints
        so far, the checkpointer's wait, vacuums, long statements."""
        lines = []
        for before, (at, done, checkpointer, vacuums, active, cpu) in zip(self.samples, self.samples[1:], strict=False):
            if start - margin <= at <= end + margin:
                clock = f"{time.strftime('%H:%M:%S', time.gmtime(at))}.{int(at % 1 * 10)}"
                lines.append(
                    f"{clock} worker CPU {cpu - before[5]:.2f} s; checkpoints {done}, checkpointer {checkpointer}; "
                    f"vacuum: {vacuums or '-'}; active: {active or '-'}"
                )
        return lines

    def checkpoints(self) -> list[float]:
        """When the count of finished checkpoints went up (epoch seconds of the first sample after)."""
        return [
            later[0] for earlier, later in zip(self.samples, self.samples[1:], strict=False) if later[1] > earlier[1]
        ]


def stalls(seen: list[tuple[float, float]], threshold: float = 1.0) -> list[tuple[float, float, int]]:
    """Runs of events later than `threshold` seconds, by due time: [(first due, last due, events)],
    events within 2 s of each other in one run."""
    late = sorted(due for due, lag in seen if lag > threshold)
    runs: list[tuple[float, float, int]] = []
    for due in late:
        if runs and due - runs[-1][1] <= 2.0:
            first, _, count = runs[-1]
            runs[-1] = (first, due, count + 1)
        else:
            runs.append((due, due, 1))
    return runs
