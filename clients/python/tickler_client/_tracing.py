"""OpenTelemetry, when the program has it installed: calls carry the current trace context, and
`consume` runs each handler in a `process` span linked to the event's producer (SPEC §11).

Without opentelemetry this module does nothing (the client depends on nothing but requests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tickler_client.models import Lease

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # not installed: no tracing
    trace = None  # type: ignore[assignment]

_tracer: Any = None


def current_headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span; empty without one."""
    if trace is None:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


@contextmanager
def process_span(lease: Lease) -> Iterator[None]:
    """The handler's span: a single event's continues its producer's trace, every event's
    producer is linked; an exception the handler raises marks it as failed."""
    global _tracer
    if trace is None:
        yield
        return
    if _tracer is None:
        _tracer = trace.get_tracer("tickler_client")
    propagator = TraceContextTextMapPropagator()
    producers = []
    for event in lease.events:
        traceparent = event.raw.get("traceparent")
        if isinstance(traceparent, str):
            headers = {"traceparent": traceparent}
            if isinstance(event.raw.get("tracestate"), str):
                headers["tracestate"] = event.raw["tracestate"]
            found = trace.get_current_span(propagator.extract(headers)).get_span_context()
            if found.is_valid:
                producers.append(found)
    parent = None
    if len(lease.events) == 1 and producers:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(producers[0]))
    queue = lease.events[0].queue if lease.events else ""
    attributes: dict[str, Any] = {
        "messaging.system": "tickler",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "tickler.lease_id": lease.lease_id,
    }
    if len(lease.events) == 1:
        event = lease.events[0]
        attributes.update(
            {
                "messaging.message.id": str(event.id),
                "tickler.item_key": event.item_key,
                "tickler.attempt": event.redeliver_count + 1,
            }
        )
    with _tracer.start_as_current_span(
        f"process {queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=[trace.Link(p) for p in producers],
        attributes=attributes,
    ):
        yield


def mark_failed(error: BaseException) -> None:
    """The current (process) span failed with the handler's exception."""
    if trace is None:
        return
    span = trace.get_current_span()
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
