"""Prometheus metrics of delivery (process-wide, shown by /metrics of `tickler serve`, or by
`tickler worker --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DELIVERED = Counter("tickler_events_delivered_total", "Events delivered, by queue.", ["queue"])
FAILED = Counter("tickler_delivery_failures_total", "Failed delivery attempts (leases), by queue.", ["queue"])
DEAD = Counter("tickler_events_dead_total", "Events finished as dead, by queue.", ["queue"])
LEASE_EXPIRED = Counter("tickler_leases_expired_total", "Events whose lease expired, by queue.", ["queue"])
LATENESS = Histogram(
    "tickler_delivery_lateness_seconds",
    "From an event's due time to the start of its delivery, by queue.",
    ["queue"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
CLAIM_BATCH = Histogram(
    "tickler_claim_batch_size",
    "Leases obtained per claim, by queue.",
    ["queue"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
