"""Per-queue gauges for /metrics, read from the database at scrape time.

Every process answers the same values (they come from the counters table and the open-event
indexes, not from process memory), so it does not matter which gunicorn worker or `tickler
serve` a scrape reaches, and no multiprocess aggregation is involved. See
QueueOperations.gauges for how each value is read without counting rows by scan.
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy.exc
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tickler.scheduler.store.operations import QueueOperations

log = structlog.get_logger(__name__)

# (metric name, help, QueueGauges attribute)
GAUGES = (
    ("tickler_queue_pending", "Open events not in flight (due or not), by queue.", "pending"),
    ("tickler_queue_due", "Pending events whose time has come, by queue.", "due"),
    ("tickler_queue_in_flight", "Events claimed under a live lease, by queue.", "in_flight"),
    ("tickler_queue_dead", "Events finished as dead (and not retried), by queue.", "dead"),
    (
        "tickler_queue_oldest_due_age_seconds",
        "Seconds since the oldest due event that is not in flight came due (0: none), by queue.",
        "oldest_due_age_seconds",
    ),
    ("tickler_queue_paused", "1 while the queue is paused, else 0, by queue.", "paused"),
)


class QueueGaugeCollector(Collector):
    """A prometheus-client collector of every queue's gauges; one query per scrape."""

    def __init__(self, queues: QueueOperations) -> None:
        self.queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("tickler_queue_gauges_up", "1 when the queue gauges could be read from the database.")
        try:
            gauges = self.queues.gauges()
        except sqlalchemy.exc.DBAPIError as error:
            # A scrape must not fail with the database: the other metrics still say something.
            log.warning("queue_gauges_unavailable", error=str(error.orig))
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for name, help_text, attribute in GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["queue"])
            for queue in gauges:
                family.add_metric([queue.name], float(getattr(queue, attribute)))
            yield family
