"""Cron expressions in a time zone: which instants (UTC) a recurring schedule fires at.

APScheduler 3's CronTrigger parses and matches the five fields; zoneinfo knows the time zones.
Two things are done here on top of them, on purpose:

* Weekday numbers. APScheduler 3 reads day-of-week 0 as Monday (its issue 286, kept for
  compatibility); cron reads 0 (and 7) as Sunday. The day-of-week field is translated to day
  names first, so `0 8 * * 1` fires on Mondays as users of cron expect.
* Daylight saving. The expression is matched against the zone's wall-clock time (APScheduler
  run in UTC enumerates wall times without any offset), and each matching wall time is mapped to
  one instant: a wall time that happens twice (clocks go back) fires once, at its first
  occurrence; a wall time that does not exist (clocks go forward) fires at the moment the clocks
  jump, once however many skipped wall times match. So `0 2 * * *` in Europe/Berlin fires at 03:00
  CEST on the spring-forward day and at 02:00 CEST (not again at 02:00 CET) on the fall-back day.
  (APScheduler's own DST handling returns instants that go backwards inside a repeated hour.)

Day of month and day of week both restricted (neither starting with `*`) match when either does,
as in cron (`0 8 1 * mon`: the 1st and every Monday); APScheduler alone would require both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

# Beyond this, an expression that matched nothing is taken to match never (`0 0 30 2 *`).
HORIZON = timedelta(days=366 * 100)
_MINUTE = timedelta(minutes=1)
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_WEEKDAY_TOKEN = re.compile(r"^(\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(\d+))?$")


def _weekday(value: str) -> int:
    if value.isdigit() and int(value) <= 7:
        return int(value) % 7
    if value in _DAY_NAMES:
        return _DAY_NAMES.index(value)
    raise ValueError(f"Day of week {value!r} is not 0-7 or sun-sat.")


def _weekday_names(field: str) -> str:
    """Cron's day-of-week field (0 or 7 = Sunday) as the day names APScheduler reads alike."""
    days: set[int] = set()
    for token in field.lower().split(","):
        match = _WEEKDAY_TOKEN.match(token)
        if match is None:
            raise ValueError(f"Day of week {token!r} is not valid.")
        span, step = match[1], int(match[2] or 1)
        if step < 1:
            raise ValueError("A step must be at least 1.")
        if span == "*":
            first, last = 0, 6
        elif "-" in span:
            low, high = span.split("-")
            first, last = _weekday(low), _weekday(high)
            if last == 0 and first > 0:
                last = 7  # 5-7 and fri-sun run from Friday to Sunday
            if last < first:
                raise ValueError(f"Day of week range {span!r} runs backwards.")
        else:
            first = _weekday(span)
            last = 6 if match[2] else first
        days.update(day % 7 for day in range(first, last + 1, step))
    return ",".join(_DAY_NAMES[day] for day in sorted(days))


@dataclass(frozen=True)
class Cron:
    """A parsed expression and its zone; `after(t)` gives the occurrences after instant t."""

    expression: str
    zone: ZoneInfo
    _trigger: BaseTrigger

    def after(self, instant: datetime) -> Iterator[datetime]:
        """The occurrences strictly after `instant`, in UTC, in order (until the horizon)."""
        local = instant.astimezone(self.zone).replace(tzinfo=None)
        wall = local.replace(second=0, microsecond=0)
        horizon = instant + HORIZON
        last = instant
        while True:
            found = self._trigger.get_next_fire_time(None, wall.replace(tzinfo=UTC))
            if found is None:
                return
            wall = found.replace(tzinfo=None)
            occurrence = self._instant(wall)
            if occurrence > horizon:
                return
            if occurrence > last:
                last = occurrence
                yield occurrence
            wall += _MINUTE

    def next(self, instant: datetime, n: int) -> list[datetime]:
        """The next `n` occurrences after `instant` (fewer only if it stops firing)."""
        found = []
        for occurrence in self.after(instant):
            found.append(occurrence)
            if len(found) == n:
                break
        return found

    def _instant(self, wall: datetime) -> datetime:
        """The instant (UTC) a matching wall time fires at; see the module's docstring."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if first.astimezone(self.zone).replace(tzinfo=None) == wall:
            return first  # it exists; fold=0 is its first occurrence if it happens twice
        # A wall time skipped by the clocks going forward: fold=1 reads it with the offset after
        # the jump, an instant before the jump. Find the jump between the two readings.
        before = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        after = first
        offset_after = after.astimezone(self.zone).utcoffset()
        while after - before > timedelta(seconds=1):
            middle = before + (after - before) / 2
            if middle.astimezone(self.zone).utcoffset() == offset_after:
                after = middle
            else:
                before = middle
        return after.replace(microsecond=0)


def parse(expression: str, timezone: str) -> Cron:
    """Parse a five-field cron expression in an IANA time zone; ValueError names the problem."""
    # The search stops here: without an end, APScheduler looks for `0 0 30 2 *` until year 9999.
    # (The local clock only bounds a search; occurrences are computed from the database's time.)
    end = datetime.now(UTC) + HORIZON + HORIZON
    zone = parse_timezone(timezone)
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"A cron expression has 5 fields (minute hour day month weekday); got {len(fields)}.")
    minute, hour, day, month, weekday = fields
    names = _weekday_names(weekday)

    def trigger(day: str, day_of_week: str) -> CronTrigger:
        return CronTrigger(
            minute=minute, hour=hour, day=day, month=month, day_of_week=day_of_week, timezone=UTC, end_date=end
        )

    either: BaseTrigger
    if not day.startswith("*") and not weekday.startswith("*"):
        either = OrTrigger([trigger(day, "*"), trigger("*", names)])
    else:
        either = trigger(day, names)
    return Cron(expression=expression, zone=zone, _trigger=either)


def parse_timezone(name: str) -> ZoneInfo:
    """An IANA time zone by name; ValueError when there is none of that name."""
    # available_timezones() refuses what ZoneInfo would also open: paths, "localtime", files
    # that are not zones.
    if name not in _zone_names():
        raise ValueError(f"Unknown time zone {name!r}; use an IANA name such as Europe/Berlin or UTC.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"Unknown time zone {name!r}; use an IANA name such as Europe/Berlin or UTC.") from None


_ZONES: frozenset[str] | None = None


def _zone_names() -> frozenset[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = frozenset(available_timezones())
    return _ZONES
