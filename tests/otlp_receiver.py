"""A real OTLP/HTTP trace receiver for tracing tests: a local HTTP server that decodes the
exporters' protobuf (opentelemetry-proto) and keeps every span it was sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.helpers_http import QuietHandler, serving
from tests.helpers_wait import wait_until


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int  # SpanKind: 2 server, 3 client, 4 producer, 5 consumer
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace_id, span_id)
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


@dataclass
class OtlpReceiver:
    endpoint: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def wait_named(self, name: str, count: int = 1, timeout: float = 60.0) -> list[ReceivedSpan]:
        # A deadline, not a pause: a retried attempt's span comes after the backoff, the worker's
        # next claim and the exporter's batch; on a 2-core box running the suite in parallel that
        # once took over 20 s.
        return wait_until(
            lambda: len(self.named(name)) >= count and self.named(name),
            timeout,
            what=lambda: f"{count} spans {name!r}; received {sorted(s.name for s in self.spans)}",
        )


@contextmanager
def running_otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            request = ExportTraceServiceRequest.FromString(self.body())
            found = []
            for resource_spans in request.resource_spans:
                service = next(
                    (_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append(
                            ReceivedSpan(
                                name=span.name,
                                service=service,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                attributes={a.key: _value(a.value) for a in span.attributes},
                                links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                status_code=span.status.code,
                                status_message=span.status.message,
                            )
                        )
            with receiver.lock:
                receiver.spans.extend(found)
                receiver.requests += 1
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    with serving(Handler) as base:
        receiver.endpoint = base
        yield receiver
