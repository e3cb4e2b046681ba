"""Prometheus metrics of the HTTP API.

Metric objects are process-wide (prometheus_client's default registry). Under gunicorn with
several workers, set PROMETHEUS_MULTIPROC_DIR to an empty directory so that /metrics adds up
every worker (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os

from flask import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

HTTP_REQUESTS = Counter(
    "tickler_http_requests_total", "HTTP requests by route, method and status.", ["route", "method", "status"]
)
HTTP_DURATION = Histogram(
    "tickler_http_request_duration_seconds",
    "HTTP request duration by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
EVENTS_SCHEDULED = Counter(
    "tickler_events_scheduled_total",
    "Events submitted for scheduling, by queue and outcome (created, ignored, replaced, rejected).",
    ["queue", "outcome"],
)


def metrics_response(database_gauges: CollectorRegistry | None = None) -> Response:
    """This process's metrics (all workers' under PROMETHEUS_MULTIPROC_DIR), then the gauges read
    from the database (`database_gauges`), which are the same whichever process answers."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        payload = generate_latest(registry)
    else:
        payload = generate_latest()
    if database_gauges is not None:
        payload += generate_latest(database_gauges)
    # content_type, not mimetype: the latter would append a second "; charset=utf-8".
    return Response(payload, content_type=CONTENT_TYPE_LATEST)
