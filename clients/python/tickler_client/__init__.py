"""A client for tickler — delayed events with natural keys: schedule, move, cancel and trace
events by key, consume them as a pull consumer, and verify webhook deliveries.

>>> from tickler_client import Client
>>> with Client("http://127.0.0.1:8080", token) as tickler:
...     tickler.schedule("emails", "welcome:ana@example.com", {"template": "welcome"}, delay=3600)

`AsyncClient` offers the same calls for asyncio; `tickler_client.outbox` schedules inside your
own PostgreSQL transaction (install `tickler-client[outbox]`).
"""

from __future__ import annotations

from tickler_client._events import NewEvent
from tickler_client._version import __version__
from tickler_client.aio import AsyncClient
from tickler_client.client import Client
from tickler_client.consume import ConsumeStats, Nack
from tickler_client.errors import (
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    ServerError,
    ServiceUnavailable,
    StaleLease,
    TicklerError,
    TransportError,
    Unauthorized,
    ValidationError,
    WebhookVerificationError,
)
from tickler_client.models import (
    BatchResult,
    DeletedQueue,
    Erasure,
    Event,
    Lease,
    NackResult,
    Page,
    Queue,
    Schedule,
    Timeline,
    TimelineEntry,
    Token,
)
from tickler_client.webhooks import WebhookDelivery, verify_webhook

__all__ = [
    "AsyncClient",
    "BatchResult",
    "Client",
    "Conflict",
    "ConsumeStats",
    "DeletedQueue",
    "Erasure",
    "Event",
    "Forbidden",
    "Lease",
    "Nack",
    "NackResult",
    "NewEvent",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "PreconditionFailed",
    "Queue",
    "Schedule",
    "ServerError",
    "ServiceUnavailable",
    "StaleLease",
    "TicklerError",
    "Timeline",
    "TimelineEntry",
    "Token",
    "TransportError",
    "Unauthorized",
    "ValidationError",
    "WebhookDelivery",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
