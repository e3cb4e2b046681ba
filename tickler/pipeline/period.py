"""What a history report covers and how it buckets lateness: shared by the report's computation
(report.py) and its HTML page (report_html.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time

# Lateness histogram buckets: (label, upper bound in seconds, exclusive); None: no bound.
LATENESS_BUCKETS: tuple[tuple[str, float | None], ...] = (
    ("early", 0.0),
    ("< 1 s", 1.0),
    ("1-5 s", 5.0),
    ("5-30 s", 30.0),
    ("30 s-1 min", 60.0),
    ("1-5 min", 300.0),
    ("5-15 min", 900.0),
    ("15 min-1 h", 3600.0),
    ("1-6 h", 21600.0),
    ("6-24 h", 86400.0),
    (">= 1 day", None),
)


@dataclass(frozen=True)
class Period:
    """Days [since, until) in UTC."""

    since: date
    until: date

    @property
    def start(self) -> datetime:
        return datetime.combine(self.since, time(), UTC)

    @property
    def end(self) -> datetime:
        return datetime.combine(self.until, time(), UTC)
