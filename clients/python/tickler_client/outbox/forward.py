"""Sending a batch of outbox rows to tickler — one row per key, the key's oldest (the relay
sends a key's next row only once this one is done) — schedules of one queue together in one
batch request, and each row's fate decided by tickler's answer.

A row is *done* once tickler answered it — accepted, or refused for good (a 400, a 404, a key
already taken with `on_conflict="reject"`): sending it again would get the same answer. A row
*stays* when there was no usable answer (no answer, a 5xx, 401/403: a wrong token is the
relay's problem, not the call's) or when its event is in flight (409; a cancel or reschedule
must wait for the delivery to end rather than be dropped). The later rows of its key wait
behind it: they are never sent ahead of it.

A row another relay may have sent before it died (`maybe_sent`) is checked against tickler
first, so that a resend is never a second effect. Since a key's rows are sent one at a time,
nothing of the key was sent after it, and tickler's state of the key shows whether it landed:
- schedule: if the key's latest event already has the row's data, time and group, it landed
  (also when it was delivered meanwhile: sending it again would schedule it twice);
- reschedule: if the open event already has the row's time, data and group, it landed;
- cancel: sent again as it is; a cancel that landed answers 404 (nothing open), which is done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tickler_client._fields import UNSET
from tickler_client.client import Client
from tickler_client.errors import (
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ServerError,
    ServiceUnavailable,
    TicklerError,
    TransportError,
    Unauthorized,
    ValidationError,
)
from tickler_client.models import parse_time

log = logging.getLogger("tickler_client.outbox")

# No usable answer: the row stays and is sent again later.
NOT_ANSWERED = (TransportError, ServiceUnavailable, ServerError, Unauthorized, Forbidden)
# on_conflict values whose batch answer means the same as the single call's.
BATCHABLE = ("reject", "ignore")


@dataclass(frozen=True)
class Row:
    """One outbox row as the relay reads it."""

    id: int
    queue: str
    item_key: str
    operation: str
    body: dict[str, Any]
    tries: int = 0
    maybe_sent: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.queue, self.item_key)


@dataclass
class Outcome:
    """What became of a batch: rows to delete, rows refused by tickler (deleted too, and
    reported), and rows that stay with the reason."""

    done: list[int] = field(default_factory=list)
    refused: list[tuple[Row, TicklerError]] = field(default_factory=list)
    stay: dict[int, str] = field(default_factory=dict)


class Forwarder:
    def __init__(self, client: Client, on_refused: Callable[[Row, TicklerError], object] | None = None) -> None:
        self.client = client
        self.on_refused = on_refused

    def forward(self, rows: Iterable[Row]) -> Outcome:
        """Send the rows (the oldest of their keys, one per key) and sort out the answers."""
        batch = sorted(rows, key=lambda r: r.id)
        if len({row.key for row in batch}) != len(batch):
            raise ValueError("one row per key: a key's next row is sent once this one is done")
        outcome = Outcome()
        self._send_all(batch, outcome)
        return outcome

    def _send_all(self, rows: list[Row], outcome: Outcome) -> None:
        batches: dict[tuple[str, str], list[Row]] = {}
        for row in rows:
            try:
                if row.maybe_sent and self._landed(row):
                    log.info("outbox row %s (%s %s) had reached tickler already", row.id, row.operation, row.item_key)
                    outcome.done.append(row.id)
                    continue
            except NOT_ANSWERED as error:
                outcome.stay[row.id] = str(error)
                continue
            on_conflict = row.body.get("on_conflict", "reject")
            if row.operation == "schedule" and on_conflict in BATCHABLE:
                batches.setdefault((row.queue, on_conflict), []).append(row)
            else:
                self._send_one(row, outcome)
        for (queue, on_conflict), batch in batches.items():
            self._send_batch(queue, on_conflict, batch, outcome)

    def _send_batch(self, queue: str, on_conflict: Any, rows: list[Row], outcome: Outcome) -> None:
        if len(rows) == 1:
            self._send_one(rows[0], outcome)
            return
        items = [{"item_key": row.item_key, **_event_fields(row.body)} for row in rows]
        try:
            results = self.client.schedule_batch(queue, items, on_conflict=on_conflict)
        except (ValidationError, PayloadTooLarge):
            # One bad or large item refuses the whole batch (nothing written), or the batch is over
            # the body limit: each row gets its own answer when sent alone.
            for row in rows:
                self._send_one(row, outcome)
            return
        except NOT_ANSWERED as error:
            outcome.stay.update((row.id, str(error)) for row in rows)
            return
        except TicklerError as error:  # 404: no such queue for this token
            for row in rows:
                self._refused(row, error, outcome)
            return
        for row, result in zip(rows, results, strict=True):
            if result.outcome == "rejected":
                taken = Conflict(
                    f"{row.item_key!r}: an open event already holds the key.", status=409, title="Conflict"
                )
                self._refused(row, taken, outcome)
            else:
                outcome.done.append(row.id)

    def _send_one(self, row: Row, outcome: Outcome) -> None:
        try:
            self._call(row)
        except NOT_ANSWERED as error:
            outcome.stay[row.id] = str(error)
        except Conflict as error:
            if row.operation == "schedule" and row.body.get("on_conflict", "reject") == "reject":
                self._refused(row, error, outcome)  # the key is taken: the answer for good
            else:
                outcome.stay[row.id] = str(error)  # in flight: wait for the delivery to end
        except TicklerError as error:
            self._refused(row, error, outcome)
        else:
            outcome.done.append(row.id)

    def _call(self, row: Row) -> None:
        body = row.body
        if row.operation == "schedule":
            fields = _event_fields(body)
            self.client.schedule(
                row.queue,
                row.item_key,
                fields.get("data"),
                schedule_on=fields.get("schedule_on"),
                group_key=fields.get("group_key"),
                max_attempts=fields.get("max_attempts"),
                on_conflict=body.get("on_conflict", "reject"),
                debounce_max_seconds=body.get("debounce_max_seconds"),
            )
        elif row.operation == "reschedule":
            self.client.reschedule(
                row.queue,
                row.item_key,
                schedule_on=body.get("schedule_on"),
                data=body.get("data"),
                group_key=body.get("group_key", UNSET),
            )
        else:
            self.client.cancel(row.queue, row.item_key, reason=body.get("reason"))

    def _landed(self, row: Row) -> bool:
        """Whether a row that may have been sent already has its effect in tickler."""
        if row.operation == "cancel":
            return False  # sent again: a cancel that landed answers 404, which is done
        try:
            event = self.client.get(row.queue, row.item_key)
        except NotFound:
            return False
        body = row.body
        same = (
            ("schedule_on" not in body or event.schedule_on == parse_time(body["schedule_on"]))
            and ("data" not in body or event.data == body["data"])
            and ("group_key" not in body or event.group_key == body["group_key"])
        )
        return same if row.operation == "schedule" else same and event.is_open

    def _refused(self, row: Row, error: TicklerError, outcome: Outcome) -> None:
        log.warning("tickler refused outbox row %s (%s %s): %s", row.id, row.operation, row.item_key, error)
        outcome.done.append(row.id)
        outcome.refused.append((row, error))
        if self.on_refused is not None:
            self.on_refused(row, error)


def _event_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A schedule row's fields of the event itself (without the call's on_conflict options)."""
    return {k: v for k, v in body.items() if k not in ("on_conflict", "debounce_max_seconds")}
