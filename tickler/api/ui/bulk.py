"""Bulk actions of the queue page: which events the page's filters pick for a cancel or a retry,
how many they are, or why the filters cannot be applied (SPEC §7: a bulk action acts on exactly
the filters the page shows, and says how many events it will change before it does)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from flask import url_for

from tickler.api.ui.store import reads
from tickler.scheduler import rules
from tickler.scheduler.states import SEARCH_STATUSES, Status
from tickler.scheduler.store import Matching
from tickler.scheduler.store.search import SearchFilter
from tickler.scheduler.store.ui_reads import Count

# Counted up to this many before the confirmation says "more than".
COUNT_CAP = 10_000
FILTERS = ("status", "group_key", "item_key_prefix", "fairness_key", "priority", "since", "until")
# Filters of the page that the bulk statements cannot apply (they match by group and key prefix),
# by their labels on the page.
UNAPPLIABLE = {"fairness_key": "Fairness key", "priority": "Priority", "since": "Due from", "until": "Due until"}


@dataclass(frozen=True)
class BulkAction:
    name: str  # "cancel" | "retry"
    status: str  # the only status it changes
    verb: str
    endpoint: str


CANCEL = BulkAction("cancel", Status.PENDING, "Cancel", "ui.cancel_matching")
RETRY = BulkAction("retry", Status.DEAD, "Retry", "ui.retry_matching")


@dataclass(frozen=True)
class BulkPlan:
    action: BulkAction
    filters: dict[str, str]  # as the page showed them (non-empty only)
    matching: Matching | None
    count: Count | None
    refused: str | None
    back: str  # the queue page with these filters


def plan(queue: str, action: BulkAction, given: Mapping[str, str], *, count: bool = True) -> BulkPlan:
    filters = {name: given.get(name, "").strip() for name in FILTERS}
    filters = {name: value for name, value in filters.items() if value}
    back = url_for("ui.queue", queue=queue) + ("?" + urlencode(filters) if filters else "")
    refused = refusal(action, filters)
    if refused:
        return BulkPlan(action, filters, None, None, refused, back)
    matching = Matching(filters.get("group_key"), filters.get("item_key_prefix"))
    found = None
    if count:
        where = SearchFilter(
            statuses=frozenset({action.status}),
            group_key=matching.group_key,
            item_key_prefix=matching.item_key_prefix,
        )
        found = reads().count(queue, where, cap=COUNT_CAP)
    return BulkPlan(action, filters, matching, found, None, back)


def refusal(action: BulkAction, filters: dict[str, str]) -> str | None:
    """Why these filters cannot be applied as they are, or None."""
    status = filters.get("status")
    if status and status not in SEARCH_STATUSES:
        return f"Status: {status!r} is not a status; choose one from the list (or any) first."
    if status and status != action.status:
        return (
            f"{action.verb} changes {action.status} events only, and the page shows {status.replace('_', ' ')} "
            f"events: choose the status {action.status} (or any) first."
        )
    for name, label in UNAPPLIABLE.items():
        if name in filters:
            return f"A bulk action cannot apply “{label}”: clear it, and narrow the events by group or key prefix."
    group_key, prefix = filters.get("group_key"), filters.get("item_key_prefix")
    if group_key is None and prefix is None:
        return "Filter by a group or a key prefix first: a bulk action over a whole queue is refused."
    if group_key is not None and rules.check_key(group_key):
        return f"Group: {rules.check_key(group_key)}"
    if prefix is not None and len(prefix) > 255:
        return "Key prefix: at most 255 characters."
    return None
