"""The dashboard's pages: queues, one queue's events, one key's timeline, leases in flight."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urlencode

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.exceptions import BadRequest
from werkzeug.exceptions import NotFound as PageNotFound
from werkzeug.wrappers import Response

from tickler.api import auth, context, export
from tickler.api.schemas.events import EXPORT_FORMATS
from tickler.api.ui import actions, bulk, charts, format
from tickler.api.ui.search_form import DEFAULT_SORT, PAGE_SIZE, SORTS, SearchForm
from tickler.api.ui.session import signed_in
from tickler.api.ui.store import dashboard, reads
from tickler.scheduler import rules
from tickler.scheduler.errors import NotFound
from tickler.scheduler.models import Event, TimelineEntry
from tickler.scheduler.states import SEARCH_STATUSES
from tickler.scheduler.store.ui_reads import Count

# The overview and a queue's page ask the browser to reload their figures this often (seconds).
REFRESH_SECONDS = 10
# A search's total is counted up to this many events, then labelled "more than".
COUNT_CAP = 10_000
# Timeline rows on one page of a key.
TIMELINE_PAGE = 100


def install(bp: Blueprint) -> None:
    format.install(bp)
    bp.add_url_rule("/", "overview", overview)
    bp.add_url_rule("/queues/<queue>", "queue", queue_page)
    bp.add_url_rule("/queues/<queue>/find", "find_key", find_key)
    bp.add_url_rule("/queues/<queue>/events/<item_key>", "key", key_page)
    bp.add_url_rule("/queues/<queue>/export", "export", export_page)
    bp.add_url_rule("/leases", "leases", leases_page)
    # Last: any other path under /ui/ gets the dashboard's own 404 page, with its headers.
    bp.add_url_rule("/<path:unknown>", "unknown", unknown_page, methods=["GET", "POST"])
    bp.app_context_processor(lambda: {"chart": charts.per_minute_chart, "upcoming_chart": charts.upcoming_chart})


def visible_names() -> list[str] | None:
    """The queues the signed-in principal may see (None: every queue, for an admin)."""
    caller = signed_in()
    return None if caller.is_admin else sorted(caller.queues)


def overview() -> str:
    queues = dashboard().overview(visible_names())
    return render_template("ui/overview.html", queues=queues, refresh=_refresh_seconds())


def _refresh_seconds() -> int:
    """`?refresh=N` (2 to 300 seconds) overrides how often a page reloads its figures."""
    try:
        asked = int(request.args.get("refresh", REFRESH_SECONDS))
    except ValueError:
        return REFRESH_SECONDS
    return min(max(asked, 2), 300)


def queue_page(queue: str) -> tuple[str, int]:
    settings = auth.visible_queue(queue)
    # SPEC §10: who holds the head of a fair-share queue (bounded read; no per-key metrics)
    backlogs = reads().fair_backlogs(queue) if settings.fair_shared else None
    form = SearchForm.from_args(request.args.to_dict())
    (summary,) = dashboard().overview([queue])
    events: list[Event] = []
    next_url = previous_url = None
    total: Count | None = None
    if not form.errors:
        where = form.search_filter()
        found = context.store().events.search(queue, where)
        events = found[:PAGE_SIZE]
        if len(found) > PAGE_SIZE:
            last = events[-1]
            next_url = _page_url(queue, form, where.cursor_after(last))
        if form.cursor and events:
            previous_url = _previous_page(queue, form, events[0])
        if not form.cursor and len(found) <= PAGE_SIZE:
            total = Count(len(found), capped=False)  # the whole result is on this page
        else:
            total = reads().count(queue, replace(where, after=None), cap=COUNT_CAP)
    status = 400 if form.errors else 200
    actions = (bulk.RETRY, bulk.CANCEL)
    refusals = {a.name: _bulk_refusal(form, a) for a in actions}
    return render_template(
        "ui/queue.html",
        queue=summary,
        form=form,
        events=events,
        total=total,
        next_url=next_url,
        previous_url=previous_url,
        statuses=sorted(SEARCH_STATUSES),
        sorts=SORTS,
        default_sort=DEFAULT_SORT,
        can_pause=signed_in().is_admin,
        refresh=_refresh_seconds(),
        backlogs=backlogs,
        upcoming=context.store().forecasts.forecast(queue, hours=24, bucket="hour"),
        bulk_actions=actions,
        bulk_refusals=refusals,
    ), status


def _bulk_refusal(form: SearchForm, action: bulk.BulkAction) -> str | None:
    """Why the page does not offer a bulk action for its filters: never for filters it refused."""
    if form.errors:
        return "the filters above are not valid: correct them first."
    return bulk.refusal(action, form.filters())


def export_page(queue: str) -> Response:
    """The queue page's events (its filters and order, every page) as a streamed CSV or JSON
    Lines download: the API's export, for the signed-in principal."""
    auth.visible_queue(queue)
    form = SearchForm.from_args(request.args.to_dict())
    if form.errors:
        raise BadRequest("; ".join(f"{name}: {message}" for name, message in form.errors.items()))
    fmt = request.args.get("format", "csv")
    if fmt not in EXPORT_FORMATS:
        raise BadRequest(f"format: one of {', '.join(EXPORT_FORMATS)}.")
    return export.export_response(queue, {**form.export_args(), "format": fmt})


def _page_url(queue: str, form: SearchForm, cursor: str | None) -> str:
    args = {**form.query(), **({"cursor": cursor} if cursor else {})}
    base = url_for("ui.queue", queue=queue)
    return f"{base}?{urlencode(args)}" if args else base


def _previous_page(queue: str, form: SearchForm, first: Event) -> str:
    """The page before the one starting at `first`: read backwards from it; when fewer than a
    page remain before it, that is the first page."""
    where = replace(form.search_filter(), limit=PAGE_SIZE + 1)
    before = reads().page_before(queue, where, where.position(first))
    if len(before) <= PAGE_SIZE:
        return _page_url(queue, form, None)
    after = before[PAGE_SIZE]
    return _page_url(queue, form, where.cursor_after(after))


def find_key(queue: str) -> Response:
    """The "find a key" box: straight to the key's page."""
    auth.visible_queue(queue)
    item_key = request.args.get("item_key", "").strip()
    if not item_key:
        return redirect(url_for("ui.queue", queue=queue))
    return redirect(url_for("ui.key", queue=queue, item_key=item_key))


@dataclass(frozen=True)
class Occurrence:
    """One event of a key (keys are reused once their event finishes) and its timeline entries
    on this page, newest first."""

    event_id: int | None  # None: the entries of the recurring schedule of that key
    entries: list[TimelineEntry]
    event: Event | None


def key_page(queue: str, item_key: str) -> str:
    auth.visible_queue(queue)
    if rules.check_key(item_key):
        raise NotFound(f"No key {item_key!r} in queue {queue!r}.")
    before = _before_arg()
    store = context.store()
    page = reads().timeline_page(queue, item_key, before=before, limit=TIMELINE_PAGE)
    archived = store.events.archived(queue, item_key)
    if not page.entries and before is None and archived is None:
        raise NotFound(f"Key {item_key!r} was never seen in queue {queue!r}.")
    occurrences: list[Occurrence] = []
    for entry in page.entries:  # newest first; consecutive entries of one event form one block
        if not occurrences or occurrences[-1].event_id != entry.event_id:
            occurrences.append(Occurrence(entry.event_id, [], None))
        occurrences[-1].entries.append(entry)
    ids = [o.event_id for o in occurrences if o.event_id is not None]
    events = {e.id: e for e in store.events.get_many(queue, item_key, ids)}
    occurrences = [replace(o, event=events.get(o.event_id) if o.event_id is not None else None) for o in occurrences]
    try:
        latest: Event | None = store.events.get(queue, item_key)
    except NotFound:
        latest = None
    older_url = None
    if page.older is not None:
        older_url = url_for("ui.key", queue=queue, item_key=item_key, before=page.older)
    return render_template(
        "ui/key.html",
        queue=queue,
        item_key=item_key,
        event=latest,
        occurrences=occurrences,
        archived=archived,
        describe=format.describe_entry,
        first_page=before is None,
        older_url=older_url,
        newest_url=url_for("ui.key", queue=queue, item_key=item_key),
        retry_typed=actions.retry_typed(queue, item_key),
    )


def _before_arg() -> int | None:
    raw = request.args.get("before", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise PageNotFound("Not a page of this timeline.")
    return int(raw)


def leases_page() -> str:
    leases = dashboard().live_leases(visible_names())
    return render_template("ui/leases.html", leases=leases, now=datetime.now(UTC))


def unknown_page(unknown: str) -> Response:
    raise PageNotFound("There is no such page in the dashboard.")
