"""The queue page's search fields as typed, checked, and turned into the store's search filter."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime

from tickler.scheduler import rules
from tickler.scheduler.states import SEARCH_STATUSES
from tickler.scheduler.store.search import ALL_STATUSES, BadCursor, SearchFilter, decode_cursor, sort_order

PAGE_SIZE = 50
# The orders the page offers, by the `sort` value in its URL (the API's `sort` values).
SORTS = {
    "-due": "due time, latest first",
    "due": "due time, earliest first",
    "-changed": "last change, newest first",
    "changed": "last change, oldest first",
}
# The page opens on the latest due events (the future ones, then the most recent past): what is
# coming and what just happened, rather than the oldest finished events.
DEFAULT_SORT = "-due"
TIME_HINT = "A UTC time such as 2026-11-22T09:00 (or RFC 3339 with an offset)."


@dataclass
class SearchForm:
    """The queue page's search fields as typed, and what is wrong with them."""

    status: str = ""
    group_key: str = ""
    item_key_prefix: str = ""
    fairness_key: str = ""
    priority: str = ""
    since: str = ""  # due from
    until: str = ""  # due until
    sort: str = ""
    cursor: str = ""
    errors: dict[str, str] | None = None

    @classmethod
    def from_args(cls, args: dict[str, str]) -> SearchForm:
        typed = {f.name: args.get(f.name, "").strip() for f in fields(cls) if f.name != "errors"}
        form = cls(**typed, errors={})
        assert form.errors is not None
        if form.status and form.status not in SEARCH_STATUSES:
            form.errors["status"] = f"Not a status: one of {', '.join(sorted(SEARCH_STATUSES))}."
        for name in ("group_key", "fairness_key"):
            problem = rules.check_key(getattr(form, name)) if getattr(form, name) else None
            if problem:
                form.errors[name] = str(problem)
        if len(form.item_key_prefix) > 255:
            form.errors["item_key_prefix"] = "At most 255 characters."
        if form.priority and form.priority_value() is None:
            form.errors["priority"] = f"A whole number from {rules.MIN_PRIORITY} to {rules.MAX_PRIORITY}."
        for name in ("since", "until"):
            try:
                form.time(name)
            except ValueError:
                form.errors[name] = TIME_HINT
        if form.sort and form.sort not in SORTS:
            form.errors["sort"] = f"Not an order: one of {', '.join(SORTS)}."
        if form.cursor:
            try:
                decode_cursor(form.cursor)
            except BadCursor:
                form.errors["cursor"] = "Not a cursor from a previous page."
        return form

    def priority_value(self) -> int | None:
        try:
            value = int(self.priority)
        except ValueError:
            return None
        return value if rules.MIN_PRIORITY <= value <= rules.MAX_PRIORITY else None

    def time(self, name: str) -> datetime | None:
        """`since` or `until` as typed in a datetime-local field (read as UTC), or RFC 3339 with an offset."""
        typed = getattr(self, name)
        if not typed:
            return None
        try:
            return rules.parse_rfc3339(typed)
        except ValueError:
            parsed = datetime.fromisoformat(typed)
            if parsed.tzinfo is not None:
                raise ValueError("an offset needs the RFC 3339 form") from None
            return parsed.replace(tzinfo=UTC)

    def sort_order(self) -> str:
        return self.sort or DEFAULT_SORT

    def search_filter(self) -> SearchFilter:
        statuses = frozenset({self.status}) if self.status else ALL_STATUSES
        return SearchFilter(
            statuses=statuses,
            group_key=self.group_key or None,
            item_key_prefix=self.item_key_prefix or None,
            fairness_key=self.fairness_key or None,
            priority=self.priority_value() if self.priority else None,
            due_from=self.time("since"),
            due_until=self.time("until"),
            **sort_order(self.sort_order()),
            limit=PAGE_SIZE + 1,
            after=decode_cursor(self.cursor) if self.cursor else None,
        )

    def filters(self) -> dict[str, str]:
        """The filters typed (not the order nor the page): what a bulk action applies."""
        names = ("status", "group_key", "item_key_prefix", "fairness_key", "priority", "since", "until")
        return {name: getattr(self, name) for name in names if getattr(self, name)}

    def query(self) -> dict[str, str]:
        """The filters and the order as the page's URL carries them."""
        return {**self.filters(), **({"sort": self.sort} if self.sort else {})}

    def export_args(self) -> dict[str, str]:
        """The filters and order in the API's names (GET /v1/queues/{queue}/export takes them)."""
        args = {name: getattr(self, name) for name in ("status", "group_key", "item_key_prefix", "fairness_key")}
        args = {k: v for k, v in args.items() if v}
        if self.priority:
            args["priority"] = self.priority
        for name, api_name in (("since", "due_from"), ("until", "due_until")):
            when = self.time(name)
            if when is not None:
                args[api_name] = rules.format_timestamp(when) or ""
        args["sort"] = self.sort_order()
        return args
