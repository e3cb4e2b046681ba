"""In-process handlers for the tracing test's worker process (`tickler worker --handlers`): the
first attempt of each event fails, the second succeeds; each opens a span of its own."""

from __future__ import annotations

from opentelemetry import trace

from tickler.scheduler.delivery.handlers import Handlers
from tickler.scheduler.models import Event

handlers = Handlers()
_tracer = trace.get_tracer("tests.tracing_handlers")


@handlers.handler("inproc")
def send(event: Event) -> None:
    with _tracer.start_as_current_span("send welcome email"):
        if event.redeliver_count == 0:
            raise RuntimeError("mail server said 421")
