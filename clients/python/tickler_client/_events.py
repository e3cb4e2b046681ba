"""Client calls on events: schedule, move, cancel, read, trace, search and retry them by key.

Each function builds the call; `Client` and `AsyncClient` send it (see `_bind`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tickler_client._fields import UNSET, Unset, deprecated, given, seconds, statuses, timestamp, when, without_none
from tickler_client._http import Answer, Call, Pages, segment
from tickler_client.models import BatchResult, Event, OnConflict, Page, Timeline, parse_event, parse_timeline


@dataclass(frozen=True)
class NewEvent:
    """One item of `schedule_batch`. Give `schedule_on` or `delay`, or neither (= due now)."""

    item_key: str
    data: dict[str, Any] = field(default_factory=dict)
    schedule_on: datetime | str | None = None
    delay: float | timedelta | None = None
    group_key: str | None = None
    max_attempts: int | None = None
    priority: int | None = None
    fairness_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "item_key": self.item_key,
            "data": self.data,
            **when(self.schedule_on, self.delay),
            **without_none(
                group_key=self.group_key,
                max_attempts=self.max_attempts,
                priority=self.priority,
                fairness_key=self.fairness_key,
            ),
        }


def _if_match(version: int | None) -> dict[str, str] | None:
    return None if version is None else {"If-Match": f'"{version}"'}


def key_path(queue: str, item_key: str, suffix: str = "") -> str:
    return f"/v1/queues/{segment(queue)}/events/{segment(item_key)}{suffix}"


def _event(answer: Answer) -> Event:
    return parse_event(answer.body)


def _page(answer: Answer) -> Page:
    return Page(events=[parse_event(e) for e in answer.body["events"]], next_cursor=answer.body.get("next_cursor"))


def _batch_results(answer: Answer) -> list[BatchResult]:
    return [
        BatchResult(item_key=str(r["item_key"]), outcome=str(r["outcome"]), id=r.get("id"))
        for r in answer.body["results"]
    ]


def schedule(
    queue: str,
    item_key: str,
    data: Mapping[str, Any] | None = None,
    *,
    schedule_on: datetime | str | None = None,
    delay: float | timedelta | None = None,
    group_key: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    fairness_key: str | None = None,
    on_conflict: OnConflict = "reject",
    debounce_max_seconds: float | timedelta | None = None,
) -> Call[Event]:
    """Schedule an event under a key of your choosing; due at `schedule_on`, after `delay`, or now.

    `on_conflict` says what happens when an open event already holds the key: `reject` raises
    `Conflict` (carrying that event), `ignore` returns it unchanged (outcome `ignored`),
    `replace` overwrites it (`replaced`), `debounce` moves it to the new time and data but
    never later than its first enqueue plus `debounce_max_seconds` (`debounced`). The answer's
    `outcome` says which happened. Retried after no answer or a 503 only with `ignore` (the
    one repeat that cannot change anything); otherwise read with `get` before trying again.
    `priority` (-100..100, default 0): claims take higher priority first. `fairness_key`: on a
    fair-share queue, due events of equal priority are handed out round robin across keys.

    >>> client.schedule("emails", "welcome:ana@example.com", {"template": "welcome"},
    ...                 delay=timedelta(days=1), group_key="ana@example.com")
    Event(id=1, queue='emails', item_key='welcome:ana@example.com', status='pending', ...)
    """
    body: dict[str, Any] = {
        "item_key": item_key,
        "data": dict(data or {}),
        "on_conflict": on_conflict,
        **when(schedule_on, delay),
        **without_none(group_key=group_key, max_attempts=max_attempts, priority=priority, fairness_key=fairness_key),
    }
    if debounce_max_seconds is not None:
        body["debounce_max_seconds"] = seconds(debounce_max_seconds)
    return Call("POST", f"/v1/queues/{segment(queue)}/events", _event, json=body, safe=on_conflict == "ignore")


def schedule_batch(
    queue: str,
    events: Iterable[NewEvent | Mapping[str, Any]],
    *,
    on_conflict: OnConflict = "reject",
    debounce_max_seconds: float | timedelta | None = None,
) -> Call[list[BatchResult]]:
    """Schedule up to 10,000 events in one request; all are validated first (one bad item: a
    `ValidationError` naming it, e.g. `events[3].item_key`, and nothing written). An item whose
    key is taken comes back `rejected` (with `on_conflict="reject"`) instead of failing the rest.
    Items are `NewEvent`s or dicts in the HTTP shape. Retried only with `on_conflict="ignore"`.

    >>> client.schedule_batch("emails", [NewEvent("a", {"n": 1}, delay=60), NewEvent("b")])
    [BatchResult(item_key='a', outcome='created', id=1), BatchResult(item_key='b', ...)]
    """
    items = [e.to_json() if isinstance(e, NewEvent) else dict(e) for e in events]
    body: dict[str, Any] = {"events": items, "on_conflict": on_conflict}
    if debounce_max_seconds is not None:
        body["debounce_max_seconds"] = seconds(debounce_max_seconds)
    path = f"/v1/queues/{segment(queue)}/events/batch"
    return Call("POST", path, _batch_results, json=body, safe=on_conflict == "ignore")


def reschedule(
    queue: str,
    item_key: str,
    *,
    schedule_on: datetime | str | None = None,
    delay: float | timedelta | None = None,
    data: Mapping[str, Any] | None = None,
    group_key: str | Unset | None = UNSET,
    if_version: int | None = None,
    priority: int | None = None,
    fairness_key: str | Unset | None = UNSET,
) -> Call[Event]:
    """Move the open event of a key and/or change its `data` or `group_key` (None removes it),
    its `priority` or its `fairness_key` (None removes it).

    With `if_version`, only if the event is still at that version (else `PreconditionFailed`).
    `Conflict` while it is in flight, `NotFound` when the key has no open event. Not retried.

    >>> event = client.get("emails", "welcome:ana@example.com")
    >>> client.reschedule("emails", event.item_key, delay=3600, if_version=event.version)
    """
    body: dict[str, Any] = {
        **when(schedule_on, delay),
        **without_none(data=None if data is None else dict(data), priority=priority),
        **given(group_key=group_key, fairness_key=fairness_key),
    }
    return Call("PATCH", key_path(queue, item_key), _event, json=body, headers=_if_match(if_version))


def cancel(queue: str, item_key: str, *, reason: str | None = None, if_version: int | None = None) -> Call[Event]:
    """Cancel the open event of a key; returns it with status `cancelled`. `NotFound` when
    nothing is open, `Conflict` in flight, `PreconditionFailed` on a stale `if_version`.
    Not retried (a repeat after a lost answer would say `NotFound`).

    >>> client.cancel("emails", "welcome:ana@example.com", reason="unsubscribed")
    """
    params = without_none(reason=reason)
    return Call("DELETE", key_path(queue, item_key), _event, params=params, headers=_if_match(if_version))


def cancel_matching(
    queue: str, *, group_key: str | None = None, item_key_prefix: str | None = None, reason: str | None = None
) -> Call[int]:
    """Cancel every open, not in-flight event of a group and/or key prefix (at least one
    filter); returns how many. Not retried.

    >>> client.cancel_matching("emails", group_key="ana@example.com", reason="account closed")
    3
    """
    body = without_none(group_key=group_key, item_key_prefix=item_key_prefix, reason=reason)
    return Call("POST", f"/v1/queues/{segment(queue)}/events/cancel", lambda a: int(a.body["cancelled"]), json=body)


def get(queue: str, item_key: str) -> Call[Event]:
    """The open event of a key, else its most recent one; `NotFound` for a key never seen.
    Retried (a read).

    >>> client.get("emails", "welcome:ana@example.com").status
    'pending'
    """
    return Call("GET", key_path(queue, item_key), _event, safe=True)


def timeline(queue: str, item_key: str) -> Call[Timeline]:
    """Everything recorded for a key, across all its occurrences, oldest first. Retried.

    >>> client.timeline("emails", "welcome:ana@example.com").actions
    ['enqueued', 'rescheduled', 'cancelled']
    """
    return Call("GET", key_path(queue, item_key, "/timeline"), lambda a: parse_timeline(a.body), safe=True)


def search_page(
    queue: str,
    *,
    status: str | Iterable[str] | None = None,
    group_key: str | None = None,
    item_key_prefix: str | None = None,
    page_size: int = 100,
    cursor: str | None = None,
    limit: int | None = None,
    priority: int | None = None,
    fairness_key: str | None = None,
    sort: str | None = None,
    due_from: datetime | str | None = None,
    due_until: datetime | str | None = None,
) -> Call[Page]:
    """One page of `search` (ordered by `schedule_on`, then id, unless `sort` says `-due`, or
    `changed` / `-changed`: by when each event last changed, oldest / newest first); pass its
    `next_cursor` back (with the same `sort`) for the next. `due_from` / `due_until`: only events
    due at or after / at or before these times (aware datetimes or RFC 3339 text); with
    `status="due"`, the events already due by `due_until`. `limit` is the old name of `page_size`
    (deprecated). Retried.

    >>> page = client.search_page("emails", status="dead", page_size=50)
    >>> page = client.search_page("emails", status="dead", page_size=50, cursor=page.next_cursor)
    """
    if limit is not None:
        deprecated("search_page(limit=)", "search_page(page_size=)")
        page_size = limit
    params = without_none(
        status=statuses(status),
        group_key=group_key,
        item_key_prefix=item_key_prefix,
        limit=str(page_size),
        cursor=cursor,
        priority=None if priority is None else str(priority),
        fairness_key=fairness_key,
        sort=sort,
        due_from=None if due_from is None else timestamp(due_from, "due_from"),
        due_until=None if due_until is None else timestamp(due_until, "due_until"),
    )
    return Call("GET", f"/v1/queues/{segment(queue)}/events", _page, params=params, safe=True)


def search(
    queue: str,
    *,
    status: str | Iterable[str] | None = None,
    group_key: str | None = None,
    item_key_prefix: str | None = None,
    page_size: int = 100,
    priority: int | None = None,
    fairness_key: str | None = None,
    sort: str | None = None,
    due_from: datetime | str | None = None,
    due_until: datetime | str | None = None,
) -> Pages[Page, Event]:
    """Every matching event, fetching page after page (`page_size` each) as you iterate (an
    async iterator on `AsyncClient`). `status` is one status or several; `sort`: `due` (the
    default), `-due`, `changed` or `-changed` (by last change, newest first). Each page is
    retried (a read).

    >>> for event in client.search("emails", status=["pending", "in_flight"], item_key_prefix="welcome:"):
    ...     print(event.item_key, event.schedule_on)
    >>> async for event in tickler.search("emails", status="dead"):
    ...     print(event.item_key)
    """

    def page(cursor: str | None) -> Call[Page]:
        return search_page(
            queue,
            status=status,
            group_key=group_key,
            item_key_prefix=item_key_prefix,
            page_size=page_size,
            cursor=cursor,
            priority=priority,
            fairness_key=fairness_key,
            sort=sort,
            due_from=due_from,
            due_until=due_until,
        )

    return Pages(page, lambda found: found.events)


def retry(
    queue: str,
    item_key: str,
    *,
    schedule_on: datetime | str | None = None,
    delay: float | timedelta | None = None,
) -> Call[Event]:
    """Open a key's `dead` event again with a fresh budget of attempts, due now, at
    `schedule_on` or after `delay`. `NotFound` when its latest event is not dead, `Conflict`
    when the key already has an open event. Not retried.

    >>> client.retry("emails", "welcome:ana@example.com", delay=60)
    """
    return Call("POST", key_path(queue, item_key, "/retry"), _event, json=when(schedule_on, delay))


def retry_matching(queue: str, *, group_key: str | None = None, item_key_prefix: str | None = None) -> Call[int]:
    """`retry` every dead event of a group and/or key prefix (at least one filter); returns how
    many. Not retried.

    >>> client.retry_matching("emails", item_key_prefix="welcome:")
    12
    """
    body = without_none(group_key=group_key, item_key_prefix=item_key_prefix)
    return Call("POST", f"/v1/queues/{segment(queue)}/events/retry", lambda a: int(a.body["retried"]), json=body)


__all__ = ["NewEvent", "timestamp"]
