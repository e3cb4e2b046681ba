"""What can go wrong in the store, as domain errors. The API maps each to one HTTP status."""

from __future__ import annotations

from typing import Any


class TicklerError(Exception):
    """Base of tickler's domain errors."""

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(TicklerError):
    """No such queue, key, lease or token (or not visible to the caller)."""


class Archived(NotFound):
    """The key has no event left in PostgreSQL: all of them were archived (`extra["archived"]` says where)."""


class KeyConflict(TicklerError):
    """An open event already has this key (`extra["event"]` is that event)."""


class InFlight(TicklerError):
    """The event is held under a live lease; it cannot be changed until the lease ends."""


class StaleVersion(TicklerError):
    """`If-Match` named a version the event no longer has."""


class StaleLease(TicklerError):
    """The lease expired, was finished, or never existed; its holder can no longer finish it."""


class TooLarge(TicklerError):
    """A payload exceeds a configured size limit."""


class Invalid(TicklerError):
    """Input the rules reject; `extra["errors"]` maps fields to messages."""


class QueueInUse(TicklerError):
    """The queue still holds open events (or an archive run holds its events): it cannot be deleted."""
