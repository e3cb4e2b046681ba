"""Client calls of pull consumers: claim due events under leases, then ack, nack or extend them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from tickler_client._fields import without_none
from tickler_client._http import Transport, segment
from tickler_client._model import from_json
from tickler_client.consume import ConsumeStats, default_worker_name, run_consumer
from tickler_client.models import Lease, NackResult, parse_time


def lease_id_of(lease: Lease | str) -> str:
    return lease.lease_id if isinstance(lease, Lease) else lease


class LeasesAPI:
    _transport: Transport

    def claim(
        self,
        queue: str,
        *,
        worker: str,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> list[Lease]:
        """Claim up to `limit` leases of due events, waiting up to `wait_seconds` (≤ 20) for one to
        fall due. Each lease holds one event, or every due event of one group. `claimed_by` is your
        token's principal + `/worker`. Not retried: a claim whose answer was lost holds leases
        nobody knows of until they expire (a redelivery), so the caller decides.

        >>> for lease in client.claim("emails", worker="mailer-1", limit=10, wait_seconds=20):
        ...     send(lease.events)
        ...     client.ack(lease)
        """
        body = without_none(worker=worker, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds)
        answer = self._transport.request(
            "POST", f"/v1/queues/{segment(queue)}/claims", json=body, extra_wait=wait_seconds
        )
        return [from_json(Lease, lease) for lease in answer.body["leases"]]

    def ack(self, lease: Lease | str) -> None:
        """Finish every event of a lease as delivered. `StaleLease` when the lease expired or was
        claimed again. Retried: an ack is fenced by its lease, so a repeat cannot finish anything
        twice (a repeat of an ack that did land answers `StaleLease`).

        >>> client.ack(lease)
        """
        path = f"/v1/leases/{segment(lease_id_of(lease))}/ack"
        self._transport.request("POST", path, safe=True, lease_call=True)

    def ack_many(self, leases: Iterable[Lease | str]) -> list[str]:
        """Ack up to 1,000 leases in one request; returns the ids that were stale (not acked).
        Retried (fenced, like `ack`).

        >>> stale = client.ack_many(leases)
        """
        ids = [lease_id_of(lease) for lease in leases]
        answer = self._transport.request("POST", "/v1/leases/ack", json={"lease_ids": ids}, safe=True)
        return [str(r["lease_id"]) for r in answer.body["results"] if r["status"] != "delivered"]

    def nack(
        self, lease: Lease | str, error: str, *, retry_in_seconds: float | None = None, dead: bool = False
    ) -> NackResult:
        """Record a failed attempt: each event is due again after the queue's backoff (or
        `retry_in_seconds`), or finished `dead` when its attempts are spent or `dead=True`.
        `StaleLease` as for `ack`. Not retried: a repeat could count a second failed attempt.

        >>> client.nack(lease, "smtp: 451 try later", retry_in_seconds=300)
        NackResult(status='retrying', dead=0, retrying=1, retry_at=datetime(...))
        """
        body: dict[str, Any] = without_none(error=error, retry_in_seconds=retry_in_seconds)
        body["dead"] = dead
        path = f"/v1/leases/{segment(lease_id_of(lease))}/nack"
        answer = self._transport.request("POST", path, json=body, lease_call=True)
        retry_at = answer.body.get("retry_at")
        return NackResult(
            status=str(answer.body.get("status", "")),
            dead=int(answer.body.get("dead", 0)),
            retrying=int(answer.body.get("retrying", 0)),
            retry_at=parse_time(retry_at) if retry_at else None,
        )

    def extend(self, lease: Lease | str, seconds: float) -> datetime:
        """Heartbeat: the lease now expires `seconds` from now (server time); returns the new
        expiry. `StaleLease` when it is no longer held. Retried: a repeat sets the same expiry.

        >>> client.extend(lease, 60)
        datetime.datetime(2026, 11, 22, 9, 1, tzinfo=datetime.timezone.utc)
        """
        path = f"/v1/leases/{segment(lease_id_of(lease))}/extend"
        answer = self._transport.request("POST", path, json={"seconds": seconds}, safe=True, lease_call=True)
        return parse_time(answer.body["expires_at"])

    def consume(
        self,
        queue: str,
        handler: Callable[[Lease], object],
        *,
        worker: str | None = None,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 10.0,
        stop: threading.Event | None = None,
        handle_signals: bool = True,
    ) -> ConsumeStats:
        """Run a pull consumer until `stop` is set or SIGINT/SIGTERM arrives; returns its counts.

        Long-polls for up to `limit` leases at a time and calls `handler(lease)` for each, one
        after the other: returning acks the lease, raising nacks it with the exception as the
        error (raise `Nack(...)` to choose `retry_in_seconds` or `dead`). While leases are held
        a heartbeat thread extends them every half lease, so a slow handler is not delivered
        twice. On a stop the loop finishes the leases it holds (none is left to expire), then
        returns; a long poll in progress ends first (up to `wait_seconds`). Signal handlers are
        installed only when called from the main thread. A 503 or no answer from the server is
        logged and the loop tries again after a pause; other errors (401, 404) are raised.

        >>> def send(lease: Lease) -> None:
        ...     for event in lease.events:
        ...         mailer.send(event.data)
        >>> client.consume("emails", send, worker="mailer-1")
        ConsumeStats(claimed=..., acked=..., nacked=..., extended=..., lost=0)
        """
        name = worker or default_worker_name()

        def claim() -> list[Lease]:
            return self.claim(queue, worker=name, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds)

        # The heartbeat thread gets a session of its own: requests does not promise that one
        # session may be used from two threads at once.
        with _LeaseCalls(self._transport.clone()) as heartbeat_calls:
            return run_consumer(
                self,
                heartbeat_calls,
                queue,
                claim,
                handler,
                lease_seconds=lease_seconds,
                stop=stop or threading.Event(),
                handle_signals=handle_signals,
            )


class _LeaseCalls(LeasesAPI):
    """The lease calls alone, over a transport of their own."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def __enter__(self) -> _LeaseCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self._transport.close()
