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

from tickler.scheduler.db import driver_rows
from tickler.scheduler.sql import file_queries
from tickler.scheduler.store.base import EngineStore

BUCKETS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1)}
MAX_HOURS = 168

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _sql(name: str) -> str:
    return file_queries("tickler.scheduler.store", "forecast.sql")[name]


def _floor(at: datetime, width: timedelta) -> datetime:
    return at - (at - _EPOCH) % width


@dataclass(frozen=True)
class Bucket:
    start: datetime
    count: int


@dataclass(frozen=True)
class Forecast:
    buckets: list[Bucket]
    # pending events falling due after the last bucket
    later: int
    # False when the counters may lack events (written before they were first counted)
    exact: bool


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
        counts = [0] * count
        later, exact = 0, False
        for row in driver_rows(self.engine, _sql("queue_forecast"), params):
            if row["part"] == "hour":
                # the first minutes of the first hour are past; the last hour may reach past the window
                for i, n in enumerate(row["minutes"]):
                    at = row["hour"] + i * minute
                    if n and at >= first_minute:
                        if at < end:
                            counts[(at - start) // width] += n
                        else:
                            later += n
            elif row["part"] == "later":
                later += int(row["n"])
            elif row["part"] == "passed":
                counts[0] -= int(row["n"])
            else:
                exact = bool(row["n"])
        return Forecast([Bucket(start + i * width, n) for i, n in enumerate(counts)], later, exact)

    def fold(self) -> int:
        """Fold the counters' per-backend slots together; returns the rows removed."""
        [[removed]] = driver_rows(self.engine, _sql("fold_due_counts"), tuples=True)
        return int(removed)
