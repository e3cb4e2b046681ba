"""The W3C trace context a caller sent (SPEC §11): parsed, normalised, or ignored when malformed.

Standard library only: the Spark import checks its `traceparent` column with it on executors that
have nothing but Python and pyspark (tickler.scheduler.tracing needs structlog and, when on,
opentelemetry).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# W3C Trace Context, level 1: version 00 has exactly these four fields; a later version may add
# fields after them (and ff is never valid). All-zero ids are invalid.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACESTATE = re.compile(r"[\x20-\x7e]{0,512}")


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context as it travels: the `traceparent` header and its `tracestate`."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @classmethod
    def parse(cls, traceparent: object, tracestate: object = None) -> TraceContext | None:
        """The context, or None when `traceparent` is missing or malformed (ignored, never refused)."""
        if not isinstance(traceparent, str):
            return None
        value = traceparent.strip().lower()
        found = _TRACEPARENT.fullmatch(value)
        if found is None:
            return None
        version, trace_id, span_id, _flags, rest = found.groups()
        if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(span_id) == {"0"}:
            return None
        state = tracestate.strip() if isinstance(tracestate, str) else None
        if not state or _TRACESTATE.fullmatch(state) is None:
            state = None
        return cls(value[:55], state)

    @classmethod
    def from_headers(cls, headers: Any) -> TraceContext | None:
        """From request headers (any mapping with `.get`: Flask's, http.client's, a dict)."""
        return cls.parse(headers.get("traceparent"), headers.get("tracestate"))

    @classmethod
    def of_row(cls, row: Any) -> TraceContext | None:
        """The context kept with an event (its `traceparent` and `tracestate` fields)."""
        traceparent = getattr(row, "traceparent", None)
        return None if traceparent is None else cls(traceparent, getattr(row, "tracestate", None))

    def headers(self) -> dict[str, str]:
        found = {"traceparent": self.traceparent}
        if self.tracestate:
            found["tracestate"] = self.tracestate
        return found
