"""Pull consumers: claim due events under a lease, then ack, nack or extend the lease."""

from __future__ import annotations

import threading
import time
import uuid

from flask import Blueprint, Flask, Response, current_app, jsonify

from api import context
from api.lease_schemas import AckManySchema, ClaimSchema, ExtendSchema, NackSchema
from scheduler import metrics
from scheduler.errors import StaleLease
from scheduler.models import Lease, lease_to_json
from scheduler.rules import format_timestamp
from scheduler.wakeup import WakeupListener

claims_bp = Blueprint("claims", __name__, url_prefix="/queues/<queue>/claims")
leases_bp = Blueprint("leases", __name__, url_prefix="/leases")

_claim_schema = ClaimSchema()
_nack_schema = NackSchema()
_extend_schema = ExtendSchema()
_ack_many_schema = AckManySchema()
_listener_lock = threading.Lock()


def _listener(app: Flask) -> WakeupListener:
    """The process's LISTEN connection for long polls, started on first use."""
    with _listener_lock:
        listener: WakeupListener | None = app.extensions.get("tickler.listener")
        if listener is None:
            listener = WakeupListener(context.tickler().database_url).start()
            app.extensions["tickler.listener"] = listener
        return listener


@claims_bp.post("")
def claim(queue: str) -> Response:
    target = context.visible_queue(queue)
    fields = _claim_schema.load(context.json_body())
    leases_store = context.store().leases
    worker = f"{context.principal().name}/{fields['worker']}"
    deadline = time.monotonic() + fields["wait_seconds"]
    listener = _listener(current_app._get_current_object()) if fields["wait_seconds"] > 0 else None  # type: ignore[attr-defined]
    # Pull consumers may run with no dispatcher (and so no reaper) at all: end expired leases
    # of this queue here, so that their events are claimable again.
    for expired_queue, n in leases_store.expire(queue=queue).items():
        metrics.LEASE_EXPIRED.labels(expired_queue).inc(n)
    while True:
        mark = listener.mark([queue]) if listener else ()
        leases: list[Lease] = leases_store.claim(
            target, worker=worker, limit=fields["limit"], lease_seconds=fields.get("lease_seconds")
        )
        remaining = deadline - time.monotonic()
        if leases or listener is None or remaining <= 0:
            break
        plan = leases_store.plan_sleep([queue], max_seconds=remaining)
        listener.wait([queue], mark, min(plan.seconds, remaining))
    if leases:
        metrics.CLAIM_BATCH.labels(queue).observe(len(leases))
    return jsonify({"leases": [lease_to_json(lease) for lease in leases]})


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _live_lease_queue(lease_id: str) -> str:
    """The queue of a live lease the caller may use; StaleLease (409) otherwise."""
    if not _is_uuid(lease_id):
        raise StaleLease("No such lease.")
    queue = context.store().leases.queue_of(lease_id)
    if queue is None or not context.principal().can_use(queue):
        raise StaleLease("The lease expired, was finished, or never existed.")
    return queue


def _allowed_queues() -> list[str] | None:
    caller = context.principal()
    return None if caller.is_admin else sorted(caller.queues)


@leases_bp.post("/<lease_id>/ack")
def ack(lease_id: str) -> Response:
    if not _is_uuid(lease_id):
        raise StaleLease("No such lease.")
    # One statement: the caller's queues are checked inside the ack itself.
    queue = context.store().leases.ack_one(lease_id, queues=_allowed_queues())
    metrics.DELIVERED.labels(queue).inc()
    return jsonify({"lease_id": lease_id, "status": "delivered"})


@leases_bp.post("/ack")
def ack_many() -> Response:
    """Ack up to 1,000 leases in one request and one statement; each answers delivered or stale."""
    fields = _ack_many_schema.load(context.json_body())
    lease_ids = list(dict.fromkeys(str(lease_id) for lease_id in fields["lease_ids"]))
    done = context.store().leases.ack(lease_ids, queues=_allowed_queues())
    for queue in done.values():
        metrics.DELIVERED.labels(queue).inc()
    return jsonify({"results": [{"lease_id": i, "status": "delivered" if i in done else "stale"} for i in lease_ids]})


@leases_bp.post("/<lease_id>/nack")
def nack(lease_id: str) -> Response:
    queue = _live_lease_queue(lease_id)
    fields = _nack_schema.load(context.json_body())
    result = context.store().leases.nack(
        lease_id, error=fields["error"], retry_in_seconds=fields.get("retry_in_seconds"), dead=fields["dead"]
    )
    metrics.FAILED.labels(queue).inc()
    if result.dead:
        metrics.DEAD.labels(queue).inc(result.dead)
    return jsonify(
        {
            "lease_id": lease_id,
            "status": "dead" if result.dead and not result.retried else "retrying",
            "dead": result.dead,
            "retrying": result.retried,
            "retry_at": format_timestamp(result.retry_at),
        }
    )


@leases_bp.post("/<lease_id>/extend")
def extend(lease_id: str) -> Response:
    _live_lease_queue(lease_id)
    fields = _extend_schema.load(context.json_body())
    expires = context.store().leases.extend(lease_id, seconds=fields["seconds"])
    return jsonify({"lease_id": lease_id, "expires_at": format_timestamp(expires)})
