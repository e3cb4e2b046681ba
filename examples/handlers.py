"""In-process handlers, run with:  tickler worker --handlers examples.handlers:handlers

Returning = delivered; raising = a failed attempt (retried with the queue's backoff);
raising StopDelivery = dead, no retry.
"""

from __future__ import annotations

from tickler.scheduler.delivery.handlers import Handlers, StopDelivery
from tickler.scheduler.models import Event

handlers = Handlers()


@handlers.handler("emails")
def send_email(event: Event) -> None:
    if "@" not in event.data.get("to", "@"):
        raise StopDelivery(f"not an address: {event.data['to']!r}")
    print(f"email to {event.data.get('to')}: {event.data}", flush=True)


@handlers.group_handler("digests")
def send_digest(events: list[Event]) -> None:
    # All due events of one group_key arrive together, under one lease: one digest per address.
    print(f"digest for {events[0].group_key}: {[e.item_key for e in events]}", flush=True)
