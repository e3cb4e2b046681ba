"""In-process Python handlers: a function per queue, of one event or of one group's events.

    handlers = Handlers()

    @handlers.handler("emails")
    def send_email(event: Event) -> None: ...

    @handlers.group_handler("digests")
    def send_digest(events: list[Event]) -> None: ...

Returning means delivered; raising means a failed attempt (retried with the queue's backoff);
raising `StopDelivery` finishes the events as dead. A single-event handler given a group's lease
is called once per event; if one raises, the whole lease is retried (at-least-once).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from tickler.scheduler.delivery import Dead, Delivered, Failed, Outcome
from tickler.scheduler.models import Event, Lease, Queue

MAX_ERROR_LENGTH = 2000

EventHandler = Callable[[Event], object]
GroupHandler = Callable[[list[Event]], object]


class StopDelivery(Exception):
    """Raised by a handler: do not retry, finish the events as dead."""


@dataclass
class Handlers:
    """A registry of handlers by queue; hand it to a Worker or to `tickler worker --handlers`."""

    single: dict[str, EventHandler] = field(default_factory=dict)
    grouped: dict[str, GroupHandler] = field(default_factory=dict)

    def handler(self, queue: str) -> Callable[[EventHandler], EventHandler]:
        def register(fn: EventHandler) -> EventHandler:
            self.single[queue] = fn
            return fn

        return register

    def group_handler(self, queue: str) -> Callable[[GroupHandler], GroupHandler]:
        def register(fn: GroupHandler) -> GroupHandler:
            self.grouped[queue] = fn
            return fn

        return register

    @property
    def queues(self) -> set[str]:
        return set(self.single) | set(self.grouped)


class HandlerDeliverer:
    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers

    def deliver(self, queue: Queue, lease: Lease) -> Outcome:
        try:
            group_fn = self.handlers.grouped.get(queue.name)
            if group_fn is not None:
                group_fn(list(lease.events))
            else:
                fn = self.handlers.single[queue.name]
                for event in lease.events:
                    fn(event)
        except StopDelivery as stop:
            return Dead(_describe(stop))
        except Exception as error:
            return Failed(_describe(error))
        return Delivered()


def _describe(error: BaseException) -> str:
    last = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
    return f"{type(error).__name__}: {error}{where}"[:MAX_ERROR_LENGTH]
