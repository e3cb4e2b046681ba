"""Client calls on queues (settings, counts, pause; most need an admin token) and on recurring
schedules (queue access). Each function builds the call; the clients send it (see `_bind`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tickler_client._fields import UNSET, Unset, deprecated, given, without_none
from tickler_client._http import Answer, Call, Pages, segment
from tickler_client._model import from_json
from tickler_client.models import CatchUp, DeletedQueue, Queue, Schedule, parse_schedule

Delivery = Literal["pull", "webhook"]


@dataclass(frozen=True)
class SchedulesPage:
    schedules: list[Schedule]
    next_cursor: str | None


def _queue(answer: Answer) -> Queue:
    return from_json(Queue, answer.body)


def _deleted_queue(answer: Answer) -> DeletedQueue:
    body = answer.body
    return DeletedQueue(
        name=str(body["name"]), cancelled=int(body["cancelled"]), deleted_events=int(body["deleted_events"])
    )


def _schedule_of(queue: str) -> Callable[[Answer], Schedule]:
    return lambda answer: parse_schedule(answer.body, queue)


def schedules_page(queue: str, *, page_size: int = 100, cursor: str | None = None) -> Call[SchedulesPage]:
    """One page of a queue's schedules, ordered by key (`list_schedules` reads them all). Retried."""
    params = without_none(limit=str(page_size), cursor=cursor)

    def page(answer: Answer) -> SchedulesPage:
        found = [parse_schedule(s, queue) for s in answer.body["schedules"]]
        return SchedulesPage(found, answer.body.get("next_cursor") or None)

    return Call("GET", schedule_path(queue), page, params=params, safe=True)


def schedules(queue: str, *, page_size: int = 100) -> Pages[SchedulesPage, Schedule]:
    """Every schedule of a queue, ordered by key, page after page (`page_size` each)."""
    return Pages(lambda cursor: schedules_page(queue, page_size=page_size, cursor=cursor), lambda page: page.schedules)


def put_queue(
    name: str,
    *,
    delivery: Delivery | None = None,
    webhook_url: str | None = None,
    webhook_timeout_seconds: float | None = None,
    pull: bool = False,
    lease_seconds: float | None = None,
    max_attempts: int | None = None,
    backoff_initial_seconds: float | None = None,
    backoff_max_seconds: float | None = None,
    backoff_multiplier: float | None = None,
    max_in_flight: int | Unset | None = UNSET,
    rate_per_second: float | Unset | None = UNSET,
    rotate_signing_secret: bool = False,
    fair_share: bool | None = None,
    max_in_flight_per_key: int | Unset | None = UNSET,
) -> Call[Queue]:
    """Create a queue or change the settings given (admin). `delivery="webhook"` (with
    `webhook_url`, which alone implies it) makes it a webhook queue, `delivery="pull"` a pull
    queue; a new queue is a pull queue. `pull=True` is the old spelling of `delivery="pull"`
    (deprecated). The answer that creates a webhook queue (or rotates its secret) carries
    `signing_secret`, shown only then.
    `max_in_flight` / `rate_per_second` / `max_in_flight_per_key`: a number, or None for no
    limit. `fair_share`: round robin across fairness keys among equal priority. Retried (a PUT sets
    the same state again) — except when rotating the secret.

    >>> hooks = client.put_queue("reminders", webhook_url="https://app.example.com/hooks")
    >>> hooks.signing_secret
    'whsec_...'
    """
    body: dict[str, Any] = without_none(lease_seconds=lease_seconds, max_attempts=max_attempts, fair_share=fair_share)
    if pull:
        deprecated("put_queue(pull=True)", 'put_queue(delivery="pull")')
        delivery = delivery or "pull"
    if webhook_url is not None:
        delivery = delivery or "webhook"
    if delivery is not None:
        # The server refuses a webhook without a URL and a pull queue with one, naming the field.
        body["delivery"] = without_none(mode=delivery, url=webhook_url, timeout_seconds=webhook_timeout_seconds)
    backoff = without_none(
        initial_seconds=backoff_initial_seconds, max_seconds=backoff_max_seconds, multiplier=backoff_multiplier
    )
    if backoff:
        body["backoff"] = backoff
    body.update(
        given(max_in_flight=max_in_flight, rate_per_second=rate_per_second, max_in_flight_per_key=max_in_flight_per_key)
    )
    if rotate_signing_secret:
        body["rotate_signing_secret"] = True
    return Call("PUT", f"/v1/queues/{segment(name)}", _queue, json=body, safe=not rotate_signing_secret)


def get_queue(name: str) -> Call[Queue]:
    """A queue's settings and its `counts` by status (`pending`, `due`, `in_flight`,
    `delivered`, `cancelled`, `dead`). Retried.

    >>> client.get_queue("emails").counts["due"]
    0
    """
    return Call("GET", f"/v1/queues/{segment(name)}", _queue, safe=True)


def list_queues() -> Call[list[Queue]]:
    """The queues this token may use (every queue for an admin). Retried.

    >>> [q.name for q in client.list_queues()]
    ['emails', 'reminders']
    """
    return Call("GET", "/v1/queues", lambda a: [from_json(Queue, q) for q in a.body["queues"]], safe=True)


def pause_queue(name: str) -> Call[Queue]:
    """Stop delivering from a queue (admin); scheduling, moving and cancelling go on.
    Retried (pausing twice is pausing).

    >>> client.pause_queue("emails").paused
    True
    """
    return Call("POST", f"/v1/queues/{segment(name)}/pause", _queue, safe=True)


def resume_queue(name: str) -> Call[Queue]:
    """Deliver from a paused queue again (admin). Retried.

    >>> client.resume_queue("emails").paused
    False
    """
    return Call("POST", f"/v1/queues/{segment(name)}/resume", _queue, safe=True)


def delete_queue(name: str, *, cancel_open: bool = False) -> Call[DeletedQueue]:
    """Delete a queue (admin). `Conflict` while it holds open events, unless `cancel_open`
    (they are cancelled, reason `queue deleted`; their timelines stay readable to admins).
    Not retried.

    >>> client.delete_queue("old-campaign", cancel_open=True)
    DeletedQueue(name='old-campaign', cancelled=12, deleted_events=340)
    """
    params = {"cancel_open": "true"} if cancel_open else None
    return Call("DELETE", f"/v1/queues/{segment(name)}", _deleted_queue, params=params)


def schedule_path(queue: str, schedule_key: str = "") -> str:
    path = f"/v1/queues/{segment(queue)}/schedules"
    return f"{path}/{segment(schedule_key)}" if schedule_key else path


def put_schedule(
    queue: str,
    schedule_key: str,
    *,
    cron: str,
    timezone: str = "UTC",
    data: Mapping[str, Any] | None = None,
    group_key: str | None = None,
    catch_up: CatchUp | None = None,
    paused: bool | None = None,
) -> Call[Schedule]:
    """Create or replace a recurring schedule: a 5-field `cron` in an IANA `timezone`. Each
    occurrence becomes an event keyed `{schedule_key}@{time, RFC 3339 UTC}`, enqueued exactly
    once; the next one always waits as a pending event. `catch_up` after downtime: `latest`
    (server default), `none` or `all`. Retried (a PUT sets the same state again).

    >>> client.put_schedule("reports", "daily-digest", cron="0 9 * * 1-5",
    ...                     timezone="Europe/Lisbon", data={"kind": "digest"})
    Schedule(schedule_key='daily-digest', ..., next_occurrences=[datetime(...), ...])
    """
    body: dict[str, Any] = {"cron": cron, "timezone": timezone, "data": dict(data or {})}
    body.update(without_none(group_key=group_key, catch_up=catch_up, paused=paused))
    return Call("PUT", schedule_path(queue, schedule_key), _schedule_of(queue), json=body, safe=True)


def get_schedule(queue: str, schedule_key: str) -> Call[Schedule]:
    """One schedule with its `next_occurrences` and `last_enqueued`. Retried.

    >>> client.get_schedule("reports", "daily-digest").next_occurrences[0]
    """
    return Call("GET", schedule_path(queue, schedule_key), _schedule_of(queue), safe=True)


def delete_schedule(queue: str, schedule_key: str) -> Call[Schedule]:
    """Stop a schedule and return it as it was; its pending, unclaimed occurrence is
    cancelled. `NotFound` when there is no such schedule. Not retried (a repeat would say
    `NotFound`).

    >>> client.delete_schedule("reports", "daily-digest")
    """
    return Call("DELETE", schedule_path(queue, schedule_key), _schedule_of(queue))
