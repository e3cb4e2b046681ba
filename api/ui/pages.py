"""The dashboard's pages: queues, one queue's events, one key's timeline, leases in flight."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from tickler.api import auth, context
from tickler.api.ui import charts, format
from tickler.api.ui.session import signed_in
from tickler.api.ui.store import dashboard
from tickler.scheduler import rules
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import Event, TimelineEntry
from tickler.scheduler.store.search import ALL_STATUSES, BadCursor, SearchFilter, decode_cursor, encode_cursor

PAGE_SIZE = 50
# The overview asks the browser to reload it this often (seconds).
REFRESH_SECONDS = 10


def install(bp: Blueprint) -> None:
    format.install(bp)
    bp.add_url_rule("/", "overview", overview)
    bp.add_url_rule("/queues/<queue>", "queue", queue_page)
    bp.add_url_rule("/queues/<queue>/find", "find_key", find_key)
    bp.add_url_rule("/queues/<queue>/events/<item_key>", "key", key_page)
    bp.add_url_rule("/leases", "leases", leases_page)
    bp.app_context_processor(lambda: {"chart": charts.per_minute_chart})


def visible_names() -> list[str] | None:
    """The queues the signed-in principal may see (None: every queue, for an admin)."""
    caller = signed_in()
    return None if caller.is_admin else sorted(caller.queues)


def overview() -> str:
    queues = dashboard().overview(visible_names())
    return render_template("ui/overview.html", queues=queues, refresh=_refresh_seconds())


def _refresh_seconds() -> int:
    """`?refresh=N` (2 to 300 seconds) overrides how often the overview reloads itself."""
    try:
        asked = int(request.args.get("refresh", REFRESH_SECONDS))
    except ValueError:
        return REFRESH_SECONDS
    return min(max(asked, 2), 300)


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
        after = decode_cursor(self.cursor) if self.cursor else None
        since = self.since_time()
        if after is None and since is not None:
            # Keyset order is (schedule_on, id) and ids start at 1: (since, 0) starts at `since`.
            after = (since, 0)
        return SearchFilter(
            statuses=frozenset({self.status}) if self.status else ALL_STATUSES,
            group_key=self.group_key or None,
            item_key_prefix=self.item_key_prefix or None,
            limit=PAGE_SIZE + 1,
            after=after,
        )

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


def queue_page(queue: str) -> tuple[str, int]:
    auth.visible_queue(queue)
    form = SearchForm.from_args(request.args.to_dict())
    (summary,) = dashboard().overview([queue])
    events: list[Event] = []
    next_url = None
    if not form.errors:
        found = context.store().events.search(queue, form.search_filter())
        events = found[:PAGE_SIZE]
        if len(found) > PAGE_SIZE:
            last = events[-1]
            args = {**form.filters(), "cursor": encode_cursor(last.schedule_on, last.id)}
            next_url = url_for("ui.queue", queue=queue) + "?" + urlencode(args)
    status = 400 if form.errors else 200
    return render_template(
        "ui/queue.html",
        queue=summary,
        form=form,
        events=events,
        next_url=next_url,
        statuses=sorted(ALL_STATUSES),
        can_pause=signed_in().is_admin,
    ), status


def find_key(queue: str) -> Response:
    """The "find a key" box: straight to the key's page."""
    auth.visible_queue(queue)
    item_key = request.args.get("item_key", "").strip()
    if not item_key:
        return redirect(url_for("ui.queue", queue=queue))
    return redirect(url_for("ui.key", queue=queue, item_key=item_key))


@dataclass(frozen=True)
class Occurrence:
    """One event of a key (keys are reused once their event finishes) and its timeline entries."""

    event_id: int | None  # None: the entries of the recurring schedule of that key
    entries: list[TimelineEntry]
    event: Event | None


def key_page(queue: str, item_key: str) -> str:
    auth.visible_queue(queue)
    if rules.check_key(item_key):
        raise NotFound(f"No key {item_key!r} in queue {queue!r}.")
    store = context.store()
    entries = store.events.timeline(queue, item_key)  # NotFound when never seen
    archived = store.events.archived(queue, item_key)
    by_event: dict[int | None, list[TimelineEntry]] = {}
    for entry in entries:
        by_event.setdefault(entry.event_id, []).append(entry)
    events = {e.id: e for e in store.events.get_many([eid for eid in by_event if eid is not None])}
    occurrences = [
        Occurrence(eid, list(es), events.get(eid) if eid is not None else None) for eid, es in by_event.items()
    ]
    occurrences.reverse()  # the current occurrence first
    try:
        latest: Event | None = store.events.get(queue, item_key)
    except NotFound:
        latest = None
    return render_template(
        "ui/key.html",
        queue=queue,
        item_key=item_key,
        event=latest,
        occurrences=occurrences,
        archived=archived,
        describe=describe_entry,
    )


def describe_entry(entry: TimelineEntry) -> list[tuple[str, Any]]:
    """The details of a timeline entry worth showing, as (label, value) pairs, in a stable order."""
    details = dict(entry.details)
    shown: list[tuple[str, Any]] = []
    for key, label in (
        ("attempt", "attempt"),
        ("lease_id", "lease"),
        ("lease_expires_at", "lease until"),
        ("claimed_by", "holder"),
        ("expired_at", "expired at"),
        ("error", "error"),
        ("retry_at", "retry at"),
        ("reason", "reason"),
    ):
        if key in details:
            shown.append((label, _readable(details.pop(key))))
    shown.extend((key, _readable(value)) for key, value in details.items())
    return shown


def _readable(value: Any) -> Any:
    """Times recorded in details (ISO strings in JSON) shown like every other time on the page."""
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            return format.when(datetime.fromisoformat(value))
        except ValueError:
            return value
    return value


def leases_page() -> str:
    leases = dashboard().live_leases(visible_names())
    return render_template("ui/leases.html", leases=leases, now=datetime.now(UTC))
