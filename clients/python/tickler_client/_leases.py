"""Client calls of pull consumers: claim due events under leases, then ack, nack or extend them
(each function builds the call; the clients send it, see `_bind`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from tickler_client._fields import without_none
from tickler_client._http import Answer, Call, segment
from tickler_client._model import from_json
from tickler_client.errors import StaleLease
from tickler_client.models import Lease, NackResult, Timeline, parse_time


def lease_id_of(lease: Lease | str) -> str:
    return lease.lease_id if isinstance(lease, Lease) else lease


def _leases(answer: Answer) -> list[Lease]:
    return [from_json(Lease, lease) for lease in answer.body["leases"]]


def _nothing(answer: Answer) -> None:
    return None


def _stale_ids(answer: Answer) -> list[str]:
    return [str(r["lease_id"]) for r in answer.body["results"] if r["status"] != "delivered"]


def _nack_result(answer: Answer) -> NackResult:
    retry_at = answer.body.get("retry_at")
    return NackResult(
        status=str(answer.body.get("status", "")),
        dead=int(answer.body.get("dead", 0)),
        retrying=int(answer.body.get("retrying", 0)),
        retry_at=parse_time(retry_at) if retry_at else None,
    )


def claim(
    queue: str,
    *,
    worker: str,
    limit: int = 1,
    lease_seconds: float | None = None,
    wait_seconds: float = 0.0,
) -> Call[list[Lease]]:
    """Claim up to `limit` leases of due events, waiting up to `wait_seconds` (≤ 20) for one to
    fall due. Each lease holds one event, or every due event of one group. `claimed_by` is your
    token's principal + `/worker`. Not retried: a claim whose answer was lost holds leases
    nobody knows of until they expire (a redelivery), so the caller decides.

    >>> for lease in client.claim("emails", worker="mailer-1", limit=10, wait_seconds=20):
    ...     send(lease.events)
    ...     client.ack(lease)
    """
    body = without_none(worker=worker, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds)
    path = f"/v1/queues/{segment(queue)}/claims"
    return Call("POST", path, _leases, json=body, extra_wait=wait_seconds)


def ack(lease: Lease | str) -> Call[None]:
    """Finish every event of a lease as delivered. `StaleLease` when the lease expired or was
    claimed again. Retried: an ack is fenced by its lease, so a repeat cannot finish anything
    twice. A repeat of an ack that did land answers `StaleLease` with `already_finished` true
    (and `after_unanswered_try`), which tells it from a lease that was lost.

    >>> client.ack(lease)
    """
    path = f"/v1/leases/{segment(lease_id_of(lease))}/ack"
    return Call("POST", path, _nothing, safe=True, lease_call=True)


def ack_many(leases: Iterable[Lease | str]) -> Call[list[str]]:
    """Ack up to 1,000 leases in one request; returns the ids that were stale (not acked).
    Retried (fenced, like `ack`).

    >>> stale = client.ack_many(leases)
    """
    ids = [lease_id_of(lease) for lease in leases]
    return Call("POST", "/v1/leases/ack", _stale_ids, json={"lease_ids": ids}, safe=True)


def nack(
    lease: Lease | str, error: str, *, retry_in_seconds: float | None = None, dead: bool = False
) -> Call[NackResult]:
    """Record a failed attempt: each event is due again after the queue's backoff (or
    `retry_in_seconds`), or finished `dead` when its attempts are spent or `dead=True`.
    `StaleLease` as for `ack`. Not retried: a repeat could count a second failed attempt.

    >>> client.nack(lease, "smtp: 451 try later", retry_in_seconds=300)
    NackResult(status='retrying', dead=0, retrying=1, retry_at=datetime(...))
    """
    body: dict[str, Any] = without_none(error=error, retry_in_seconds=retry_in_seconds)
    body["dead"] = dead
    path = f"/v1/leases/{segment(lease_id_of(lease))}/nack"
    return Call("POST", path, _nack_result, json=body, lease_call=True)


def extend(lease: Lease | str, seconds: float) -> Call[Lease]:
    """Heartbeat: the lease now expires `seconds` from now (server time); returns the lease with
    its new `expires_at` (given a lease id rather than a `Lease`, one that carries only its id
    and expiry). `StaleLease` when it is no longer held. Retried: a repeat sets the same expiry.

    >>> lease = client.extend(lease, 60)
    >>> lease.expires_at
    datetime.datetime(2026, 11, 22, 9, 1, tzinfo=datetime.timezone.utc)
    """

    def extended(answer: Answer) -> Lease:
        expires_at = parse_time(answer.body["expires_at"])
        if isinstance(lease, Lease):
            return dataclasses.replace(lease, expires_at=expires_at)
        return Lease(lease_id=str(answer.body["lease_id"]), expires_at=expires_at, group_key=None, events=[])

    path = f"/v1/leases/{segment(lease_id_of(lease))}/extend"
    return Call("POST", path, extended, json={"seconds": seconds}, safe=True, lease_call=True)


# The timeline entries that end a lease, as `StaleLease.lease_status`.
_ENDED_BY = {"delivered": "delivered", "failed": "retrying", "dead": "dead", "lease_expired": "expired"}


def key_of(lease: Lease | str) -> tuple[str, str] | None:
    """A key whose timeline tells how the lease ended: one of its events' (None for a bare id)."""
    if isinstance(lease, Lease) and lease.events:
        return lease.events[0].queue, lease.events[0].item_key
    return None


def explain(stale: StaleLease, lease: Lease | str, timeline: Timeline) -> None:
    """Complete a StaleLease the server could not explain from the timeline of the lease's key:
    an entry that ended this very lease says how (`delivered`: an ack that landed already)."""
    lease_id = lease_id_of(lease)
    for entry in reversed(timeline.entries):
        if entry.action in _ENDED_BY and str(entry.details.get("lease_id")) == lease_id:
            stale.lease_status = _ENDED_BY[entry.action]
            if stale.already_finished:
                stale.detail = f"{stale.detail} This lease already finished its events ({entry.action})."
                stale.args = (f"{stale.status} {stale.title}: {stale.detail}",)
            return
