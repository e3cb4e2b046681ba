"""The queue page's search fields as typed, checked, and turned into the store's search filter."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tickler.scheduler import rules
from tickler.scheduler.store.search import ALL_STATUSES, BadCursor, SearchFilter, decode_cursor

PAGE_SIZE = 50


@dataclass
class SearchForm:
    """The queue page's search fields as typed, and what is wrong with them."""

    status: str = ""
    group_key: str = ""
    item_key_prefix: str = ""
    since: str = ""
    cursor: str = ""
    errors: dict[str, str] | None = None

    @classmethod
    def from_args(cls, args: dict[str, str]) -> SearchForm:
        form = cls(
            status=args.get("status", "").strip(),
            group_key=args.get("group_key", "").strip(),
            item_key_prefix=args.get("item_key_prefix", "").strip(),
            since=args.get("since", "").strip(),
            cursor=args.get("cursor", "").strip(),
            errors={},
        )
        assert form.errors is not None
        if form.status and form.status not in ALL_STATUSES:
            form.errors["status"] = "Not a status."
        if form.group_key and rules.check_key(form.group_key):
            form.errors["group_key"] = str(rules.check_key(form.group_key))
        if len(form.item_key_prefix) > 255:
            form.errors["item_key_prefix"] = "At most 255 characters."
        if form.since:
            try:
                form.since_time()
            except ValueError:
                form.errors["since"] = "A UTC time such as 2026-11-22T09:00 (or RFC 3339 with an offset)."
        if form.cursor:
            try:
                decode_cursor(form.cursor)
            except BadCursor:
                form.errors["cursor"] = "Not a cursor from a previous page."
        return form

    def since_time(self) -> datetime | None:
        """`since` as typed in a datetime-local field (read as UTC), or RFC 3339 with an offset."""
        if not self.since:
            return None
        try:
            return rules.parse_rfc3339(self.since)
        except ValueError:
            parsed = datetime.fromisoformat(self.since)
            if parsed.tzinfo is not None:
                raise ValueError("an offset needs the RFC 3339 form") from None
            return parsed.replace(tzinfo=UTC)

    def search_filter(self) -> SearchFilter:
        after = decode_cursor(self.cursor) if self.cursor else self.start()
        return SearchFilter(
            statuses=frozenset({self.status}) if self.status else ALL_STATUSES,
            group_key=self.group_key or None,
            item_key_prefix=self.item_key_prefix or None,
            limit=PAGE_SIZE + 1,
            after=after,
        )

    def start(self) -> tuple[datetime, int] | None:
        """Where the first page starts: keyset order is (schedule_on, id) and ids start at 1, so
        (since, 0) starts at `since`."""
        since = self.since_time()
        return None if since is None else (since, 0)

    def filters(self) -> dict[str, str]:
        return {
            k: v
            for k, v in (
                ("status", self.status),
                ("group_key", self.group_key),
                ("item_key_prefix", self.item_key_prefix),
                ("since", self.since),
            )
            if v
        }
