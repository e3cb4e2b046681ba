"""Client calls on queues (settings, counts, pause; most need an admin token) and on recurring
schedules (queue access)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tickler_client._fields import UNSET, Unset, without_none
from tickler_client._http import Transport, segment
from tickler_client._model import from_json
from tickler_client.models import CatchUp, DeletedQueue, Queue, Schedule, parse_schedule


class QueuesAPI:
    _transport: Transport

    def put_queue(
        self,
        name: str,
        *,
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
    ) -> Queue:
        """Create a queue or change the settings given (admin). `webhook_url` makes it a webhook
        queue, `pull=True` a pull queue; a new queue is a pull queue. The answer that creates a
        webhook queue (or rotates its secret) carries `signing_secret`, shown only then.
        `max_in_flight` / `rate_per_second` / `max_in_flight_per_key`: a number, or None for no
        limit. `fair_share`: round robin across fairness keys among equal priority. Retried (a PUT sets
        the same state again) — except when rotating the secret.

        >>> hooks = client.put_queue("reminders", webhook_url="https://app.example.com/hooks")
        >>> hooks.signing_secret
        'whsec_...'
        """
        body: dict[str, Any] = without_none(lease_seconds=lease_seconds, max_attempts=max_attempts)
        if webhook_url is not None:
            body["delivery"] = without_none(mode="webhook", url=webhook_url, timeout_seconds=webhook_timeout_seconds)
        elif pull:
            body["delivery"] = {"mode": "pull"}
        backoff = without_none(
            initial_seconds=backoff_initial_seconds, max_seconds=backoff_max_seconds, multiplier=backoff_multiplier
        )
        if backoff:
            body["backoff"] = backoff
        if not isinstance(max_in_flight, Unset):
            body["max_in_flight"] = max_in_flight
        if not isinstance(rate_per_second, Unset):
            body["rate_per_second"] = rate_per_second
        if fair_share is not None:
            body["fair_share"] = fair_share
        if not isinstance(max_in_flight_per_key, Unset):
            body["max_in_flight_per_key"] = max_in_flight_per_key
        if rotate_signing_secret:
            body["rotate_signing_secret"] = True
        answer = self._transport.request(
            "PUT", f"/v1/queues/{segment(name)}", json=body, safe=not rotate_signing_secret
        )
        return from_json(Queue, answer.body)

    def get_queue(self, name: str) -> Queue:
        """A queue's settings and its `counts` by status (`pending`, `due`, `in_flight`,
        `delivered`, `cancelled`, `dead`). Retried.

        >>> client.get_queue("emails").counts["due"]
        0
        """
        return from_json(Queue, self._transport.request("GET", f"/v1/queues/{segment(name)}", safe=True).body)

    def list_queues(self) -> list[Queue]:
        """The queues this token may use (every queue for an admin). Retried.

        >>> [q.name for q in client.list_queues()]
        ['emails', 'reminders']
        """
        answer = self._transport.request("GET", "/v1/queues", safe=True)
        return [from_json(Queue, q) for q in answer.body["queues"]]

    def pause_queue(self, name: str) -> Queue:
        """Stop delivering from a queue (admin); scheduling, moving and cancelling go on.
        Retried (pausing twice is pausing).

        >>> client.pause_queue("emails").paused
        True
        """
        answer = self._transport.request("POST", f"/v1/queues/{segment(name)}/pause", safe=True)
        return from_json(Queue, answer.body)

    def resume_queue(self, name: str) -> Queue:
        """Deliver from a paused queue again (admin). Retried.

        >>> client.resume_queue("emails").paused
        False
        """
        answer = self._transport.request("POST", f"/v1/queues/{segment(name)}/resume", safe=True)
        return from_json(Queue, answer.body)

    def delete_queue(self, name: str, *, cancel_open: bool = False) -> DeletedQueue:
        """Delete a queue (admin). `Conflict` while it holds open events, unless `cancel_open`
        (they are cancelled, reason `queue deleted`; their timelines stay readable to admins).
        Not retried.

        >>> client.delete_queue("old-campaign", cancel_open=True)
        DeletedQueue(name='old-campaign', cancelled=12, deleted_events=340)
        """
        params = {"cancel_open": "true"} if cancel_open else None
        body = self._transport.request("DELETE", f"/v1/queues/{segment(name)}", params=params).body
        return DeletedQueue(
            name=str(body["name"]), cancelled=int(body["cancelled"]), deleted_events=int(body["deleted_events"])
        )


class SchedulesAPI:
    _transport: Transport

    def _schedule_path(self, queue: str, schedule_key: str = "") -> str:
        path = f"/v1/queues/{segment(queue)}/schedules"
        return f"{path}/{segment(schedule_key)}" if schedule_key else path

    def put_schedule(
        self,
        queue: str,
        schedule_key: str,
        *,
        cron: str,
        timezone: str = "UTC",
        data: Mapping[str, Any] | None = None,
        group_key: str | None = None,
        catch_up: CatchUp | None = None,
        paused: bool | None = None,
    ) -> Schedule:
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
        answer = self._transport.request("PUT", self._schedule_path(queue, schedule_key), json=body, safe=True)
        return parse_schedule(answer.body, queue)

    def get_schedule(self, queue: str, schedule_key: str) -> Schedule:
        """One schedule with its `next_occurrences` and `last_enqueued`. Retried.

        >>> client.get_schedule("reports", "daily-digest").next_occurrences[0]
        """
        answer = self._transport.request("GET", self._schedule_path(queue, schedule_key), safe=True)
        return parse_schedule(answer.body, queue)

    def list_schedules(self, queue: str, *, page_size: int = 100) -> list[Schedule]:
        """Every schedule of a queue, ordered by key (all pages, `page_size` each). Retried.

        >>> [s.schedule_key for s in client.list_schedules("reports")]
        ['daily-digest']
        """
        found: list[Schedule] = []
        params: dict[str, str] = {"limit": str(page_size)}
        while True:
            answer = self._transport.request("GET", self._schedule_path(queue), params=params, safe=True)
            found.extend(parse_schedule(s, queue) for s in answer.body["schedules"])
            cursor = answer.body.get("next_cursor")
            if not cursor:
                return found
            params["cursor"] = str(cursor)

    def delete_schedule(self, queue: str, schedule_key: str) -> Schedule:
        """Stop a schedule and return it as it was; its pending, unclaimed occurrence is
        cancelled. `NotFound` when there is no such schedule. Not retried (a repeat would say
        `NotFound`).

        >>> client.delete_schedule("reports", "daily-digest")
        """
        answer = self._transport.request("DELETE", self._schedule_path(queue, schedule_key))
        return parse_schedule(answer.body, queue)
