"""The names of an event's states and of its timeline actions.

The schema holds the state machine (CHECK constraints in migrations/, `tickler_status()`); these
names are how Python spells the same values, and tests/test_states.py checks them against the
schema's CHECK lists. Each is a str, so a row's value compares equal to its name.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """An event's `status`: open (pending, in flight) or how it finished (its outcome)."""

    PENDING = "pending"  # open, not under a live lease: waiting or due
    IN_FLIGHT = "in_flight"  # open, claimed under a lease that has not expired
    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    DEAD = "dead"


OPEN_STATUSES = frozenset({Status.PENDING, Status.IN_FLIGHT})
# A finished event's `outcome` column (CHECK outcome_known) holds one of these.
OUTCOMES = frozenset({Status.DELIVERED, Status.CANCELLED, Status.DEAD})
ALL_STATUSES = OPEN_STATUSES | OUTCOMES
# A search status beside the event statuses: pending events whose due time has come (the `due`
# of a queue's counts). It narrows `pending`; asked for with `pending`, it adds nothing.
DUE = "due"
SEARCH_STATUSES = ALL_STATUSES | {DUE}


class Action(StrEnum):
    """A timeline entry's `action` (CHECK tickler_timeline_action_check)."""

    ENQUEUED = "enqueued"
    REPLACED = "replaced"
    DEBOUNCED = "debounced"
    RESCHEDULED = "rescheduled"
    UPDATED = "updated"
    CLAIMED = "claimed"
    DELIVERED = "delivered"
    FAILED = "failed"
    RELEASED = "released"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"
    DEAD = "dead"
    RETRIED = "retried"
    SCHEDULE_CREATED = "schedule_created"
    SCHEDULE_UPDATED = "schedule_updated"
    SCHEDULE_DELETED = "schedule_deleted"
    ERASED = "erased"  # the last entry of an erased key (SPEC §12): of the erasure, not of an event


class OnConflict(StrEnum):
    """What scheduling does when the key already has an open event."""

    REJECT = "reject"
    IGNORE = "ignore"
    REPLACE = "replace"
    DEBOUNCE = "debounce"


class Scheduled(StrEnum):
    """What scheduling did to one requested event (the `outcome` of a schedule answer)."""

    CREATED = "created"
    IGNORED = "ignored"
    REPLACED = "replaced"
    DEBOUNCED = "debounced"
    REJECTED = "rejected"
