"""Upcoming load (SPEC §7): a queue's pending events by when they fall due, in buckets of a
minute or an hour over the next hours, and how many fall due later.

Read from tickler_due_count, which the statement triggers of tickler_event keep per queue and
hour (UTC), with the hour's 60 per-minute counts, as they keep the other counters: scheduling
adds to an event's minute, a reschedule or a retry's backoff moves it to another, a delivery, a
cancel or a death takes it off. So the forecast reads one row per hour of the window (after the
dispatcher folds the per-backend slots) and never counts events; it is exact (see `exact`). SQL
in `forecast.sql`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import add

from tickler.scheduler.db import driver_rows
from tickler.scheduler.store.base import EngineStore, sql_file

BUCKETS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1)}
MAX_HOURS = 168

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_sql = sql_file("forecast.sql")


def _floor(at: datetime, width: timedelta) -> datetime:
    return at - (at - _EPOCH) % width


@dataclass(frozen=True)
class Bucket:
    start: datetime
    count: int


@dataclass(frozen=True)
class Forecast:
    # the first bucket's start, each bucket's width, and its count (bucket i starts at start + i * width)
    start: datetime
    width: timedelta
    counts: list[int]
    # pending events falling due after the last bucket
    later: int
    # False when the counters may lack events (written before they were first counted)
    exact: bool

    @property
    def buckets(self) -> list[Bucket]:
        return [Bucket(self.start + i * self.width, n) for i, n in enumerate(self.counts)]


class ForecastStore(EngineStore):
    def forecast(self, queue: str, *, hours: int, bucket: str, now: datetime | None = None) -> Forecast:
        """The queue's pending events falling due from `now` on: per `bucket` ("minute" or "hour")
        over `hours` hours from the start of the current bucket, and those later. Events already
        due are not in it (the queue's `due` count says how many)."""
        width = BUCKETS[bucket]
        now = (now or datetime.now(UTC)).astimezone(UTC)
        start = _floor(now, width)
        count = hours * (60 if bucket == "minute" else 1)
        end = start + count * width
        minute, hour = BUCKETS["minute"], BUCKETS["hour"]
        first_minute = _floor(now, minute)
        last_hour = _floor(end - minute, hour) + hour  # the hour rows that reach into the window
        params = {"queue": queue, "from": _floor(now, hour), "to": last_hour, "minute": first_minute, "now": now}
        # In minutes from `start`: the first not yet past, the window's end, a bucket's width.
        first, stop, step = (first_minute - start) // minute, count * (width // minute), width // minute
        counts = [0] * count
        later, exact = 0, False
        for row in driver_rows(self.engine, _sql("queue_forecast"), params):
            if row["part"] == "hour":
                base = (row["hour"] - start) // minute
                if first <= base and base + 60 <= stop:  # a whole hour of the window
                    if step == 60:
                        counts[base // 60] += int(row["n"])  # its total
                    else:
                        counts[base : base + 60] = map(add, counts[base : base + 60], row["minutes"])
                    continue
                # a bucket per minute, or the first (partly past) or last (reaching past) hour
                for at, n in enumerate(row["minutes"], base):
                    if n and at >= first:
                        if at < stop:
                            counts[at // step] += n
                        else:
                            later += n
            elif row["part"] == "later":
                later += int(row["n"])
            elif row["part"] == "passed":
                counts[0] -= int(row["n"])
            else:
                exact = bool(row["n"])
        return Forecast(start, width, counts, later, exact)

    def fold(self) -> int:
        """Fold the counters' per-backend slots together; returns the rows removed."""
        [[removed]] = driver_rows(self.engine, _sql("fold_due_counts"), tuples=True)
        return int(removed)
