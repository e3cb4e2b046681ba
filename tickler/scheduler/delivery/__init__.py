"""Delivery modes: how a claimed lease reaches its receiver. Each returns an Outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tickler.scheduler.models import Lease, Queue


@dataclass(frozen=True)
class Delivered:
    pass


@dataclass(frozen=True)
class Failed:
    """A failed attempt: retried with backoff, or after `retry_in_seconds` when the receiver said."""

    error: str
    retry_in_seconds: float | None = None


@dataclass(frozen=True)
class Dead:
    """The receiver said stop: finish the events as dead, no retry."""

    error: str


Outcome = Delivered | Failed | Dead

# When a lease ends at the latest (time.monotonic(), the event loop's clock): nothing is sent after.
LeaseDeadline = Callable[[], float]


class LeaseEnded(Exception):
    """The lease ended before its request was sent (it waited past its deadline): nothing was
    sent, and there is no outcome to record (an erasure may have taken the lease away)."""


class Deliverer(Protocol):
    """Delivers on the calling thread (in-process handlers: a delivery thread each)."""

    def deliver(self, queue: Queue, lease: Lease) -> Outcome: ...


class AsyncDeliverer(Protocol):
    """Delivers on the dispatcher's event loop (webhooks: many requests in flight on one thread)."""

    async def deliver(self, queue: Queue, lease: Lease, lease_deadline: LeaseDeadline | None = None) -> Outcome:
        """Raises LeaseEnded, having sent nothing, when `lease_deadline` passed before the request went out."""
        ...

    async def aclose(self) -> None: ...
