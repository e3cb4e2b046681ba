"""Tracing with OpenTelemetry (SPEC §11), off by default and free when off.

Tracing is on when the process has an SDK tracer provider: one the embedding program installed,
or one built here from the standard variables — `OTEL_TRACES_EXPORTER` (`otlp`, `console`,
`none`) or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` — unless `OTEL_SDK_DISABLED=true`.
opentelemetry is imported only then: without those variables, or without the `otel` extra
installed, every span below is a no-op and tickler only keeps and hands on the W3C
`traceparent`/`tracestate` its callers sent.

Span names and attributes follow OpenTelemetry's messaging conventions: `create`, `receive`,
`process` and `settle` spans named "{operation} {queue}", `messaging.system = tickler`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import structlog

from tickler.scheduler.trace_context import (
    TraceContext as TraceContext,
)  # re-exported: the engine and API import it from here

log = structlog.get_logger(__name__)

SYSTEM = "tickler"


class Span:
    """A span in progress; the no-op one (tracing off) records nothing and has no context."""

    context: TraceContext | None = None

    def set(self, **attributes: Any) -> None:
        """Set attributes (keys with `__` spelled for dots: `tickler__outcome`)."""

    def fail(self, error: str, kind: str = "error") -> None:
        """Mark the span as failed: status ERROR with the message, `error.type` = kind."""


_NOOP = Span()


def noop() -> AbstractContextManager[Span]:
    """What span() gives when tracing is off, for callers that skip building its arguments."""
    return nullcontext(_NOOP)


class _OtelSpan(Span):
    def __init__(self, span: Any) -> None:
        self._span = span
        self.context = _context_of(span)

    def set(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            if value is not None:
                self._span.set_attribute(key.replace("__", "."), value)

    def fail(self, error: str, kind: str = "error") -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("error.type", kind)
        self._span.set_status(Status(StatusCode.ERROR, error[:500]))


# The tracer, found once: None = tracing off. A lock, because the first spans may start on
# several threads at once.
_lock = threading.Lock()
_resolved = False
_tracer: Any = None


def _wanted() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(
        os.environ.get(name, "").strip()
        for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _resolve() -> Any:
    global _resolved, _tracer
    if _resolved:  # the hot path: no lock once decided
        return _tracer
    with _lock:
        if _resolved:
            return _tracer
        _resolved = True
        if not _wanted() and "opentelemetry" not in sys.modules:
            # Not asked for, and no program around us uses OpenTelemetry: not even imported.
            return None
        try:
            from opentelemetry import trace
        except ImportError:
            if _wanted():
                log.warning("tracing_unavailable", reason="OTEL_* set but opentelemetry is not installed (extra: otel)")
            return None
        provider = trace.get_tracer_provider()
        if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
            if not _wanted():
                return None
            provider = _sdk_provider()
            if provider is None:
                return None
            trace.set_tracer_provider(provider)
        _tracer = trace.get_tracer("tickler")
        log.info("tracing_on", provider=type(provider).__name__)
        return _tracer


def _sdk_provider() -> Any:
    """A provider exporting as OTEL_TRACES_EXPORTER says (default: OTLP over HTTP)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("tracing_unavailable", reason="opentelemetry-sdk is not installed (extra: otel)")
        return None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "tickler"})
    provider = TracerProvider(resource=resource)
    exporters = [e.strip() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if e.strip()]
    for name in exporters:
        if name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("tracing_unavailable", reason="opentelemetry-exporter-otlp-proto-http is not installed")
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            log.warning("tracing_exporter_unknown", exporter=name)
    return provider


def enabled() -> bool:
    return _resolve() is not None


def reset_for_tests() -> None:
    """Look at the environment and the global provider again at the next span."""
    global _resolved, _tracer
    with _lock:
        _resolved, _tracer = False, None


def _context_of(span: Any) -> TraceContext | None:
    found = span.get_span_context()
    if not found.is_valid:
        return None
    traceparent = f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"
    state = found.trace_state.to_header() if found.trace_state else None
    return TraceContext(traceparent, state or None)


def _span_context(found: TraceContext) -> Any:
    """The OpenTelemetry SpanContext of a W3C context (already checked by TraceContext.parse):
    built from its fields, cheaper than a propagator's extract on the delivery path."""
    from opentelemetry import trace

    state = None
    if found.tracestate:
        state = trace.TraceState.from_header([found.tracestate])
    return trace.SpanContext(
        trace_id=int(found.traceparent[3:35], 16),
        span_id=int(found.traceparent[36:52], 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(found.traceparent[53:55], 16)),
        trace_state=state,
    )


def _otel_context(parent: TraceContext) -> Any:
    """An OpenTelemetry Context holding `parent` as the remote parent."""
    from opentelemetry import trace

    return trace.set_span_in_context(trace.NonRecordingSpan(_span_context(parent)))


def _links(contexts: Sequence[TraceContext | None]) -> list[Any]:
    from opentelemetry import trace

    # The SDK keeps 128 links a span by default: build no more than that (a batch of 10,000).
    return [trace.Link(_span_context(found)) for found in contexts[:128] if found is not None]


_KINDS = {"create": "PRODUCER", "receive": "CONSUMER", "process": "CONSUMER", "settle": "CLIENT"}


@contextmanager
def span(
    operation: str,
    queue: str,
    *,
    parent: TraceContext | None = None,
    root: bool = False,
    links: Sequence[TraceContext | None] = (),
    start_ns: int | None = None,
    active: bool = False,
    **attributes: Any,
) -> Iterator[Span]:
    """A messaging span `operation` (create, receive, process, settle) on `queue`.

    Its parent is `parent` when given, else a new trace when `root`, else the current span;
    `links` are the contexts it relates to (the producers'). `active`: the span is the current
    one inside the block (an in-process handler's spans are its children). An exception raised
    in the block is recorded on the span and raised again.
    """
    tracer = _resolve()
    if tracer is None:
        yield _NOOP
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    if parent is not None:
        ctx = _otel_context(parent)
    elif root:
        ctx = otel_context.Context()
    else:
        ctx = None
    name, kind = f"{operation} {queue}", getattr(trace.SpanKind, _KINDS.get(operation, "INTERNAL"))
    if active:  # current inside the block: records an exception raised in it, and ends on exit
        manager = tracer.start_as_current_span(name, context=ctx, kind=kind, links=_links(links), start_time=start_ns)
    else:
        manager = _started(tracer, name, ctx, kind, links, start_ns)
    with manager as otel_span:
        handle = _OtelSpan(otel_span)
        handle.set(
            messaging__system=SYSTEM,
            messaging__operation__type=operation,
            messaging__operation__name=operation,
            messaging__destination__name=queue,
            **attributes,
        )
        yield handle


@contextmanager
def _started(
    tracer: Any, name: str, ctx: Any, kind: Any, links: Sequence[TraceContext | None], start_ns: int | None
) -> Iterator[Any]:
    """A span that is not made current (the calling thread's context stays as it was)."""
    from opentelemetry import trace

    started = tracer.start_span(name, context=ctx, kind=kind, links=_links(links), start_time=start_ns)
    try:
        yield started
    except BaseException as error:
        started.record_exception(error)
        started.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        raise
    finally:
        started.end()


def record(
    operation: str,
    queue: str,
    start_ns: int,
    *,
    parent: TraceContext | None = None,
    root: bool = False,
    links: Sequence[TraceContext | None] = (),
    error: str | None = None,
    error_type: str = "error",
    **attributes: Any,
) -> None:
    """A span of work already done (from `start_ns` until now): a claim that found events, a
    finish written for many leases in one statement. Nothing when tracing is off."""
    if _resolve() is None:
        return
    with span(operation, queue, parent=parent, root=root, links=links, start_ns=start_ns, **attributes) as done:
        if error is not None:
            done.fail(error, error_type)


def current_headers() -> dict[str, str]:
    """The current span's `traceparent`/`tracestate` headers (empty: tracing off or no span)."""
    if _resolve() is None:
        return {}
    from opentelemetry import trace

    found = _context_of(trace.get_current_span())
    return found.headers() if found is not None else {}


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans still buffered (at shutdown)."""
    if _resolve() is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis)
