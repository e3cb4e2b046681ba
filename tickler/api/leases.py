"""Pull consumers: claim due events under a lease, then ack, nack or extend the lease."""

from __future__ import annotations

import time
import uuid

from flask import Blueprint, Response, current_app, jsonify, request

from tickler.api import auth, context
from tickler.api.schemas.leases import AckManySchema, ClaimSchema, ExtendSchema, NackSchema
from tickler.scheduler import tracing
from tickler.scheduler.errors import Invalid, StaleLease
from tickler.scheduler.rules import format_timestamp, lease_to_json
from tickler.scheduler.states import Status
from tickler.scheduler.tracing import TraceContext
from tickler.scheduler.waiting import PullClaims

claims_bp = Blueprint("claims", __name__, url_prefix="/queues/<queue>/claims")
leases_bp = Blueprint("leases", __name__, url_prefix="/leases")

_claim_schema = ClaimSchema()
_nack_schema = NackSchema()
_extend_schema = ExtendSchema()
_ack_many_schema = AckManySchema()


@claims_bp.post("")
def claim(queue: str) -> Response:
    target = auth.visible_queue(queue)
    fields = _claim_schema.load(context.json_body())
    longest = context.tickler().settings.max_wait_seconds
    if fields["wait_seconds"] > longest:
        message = f"Must be less than or equal to {longest:g} (TICKLER_MAX_WAIT_SECONDS)."
        raise Invalid("The request is not valid.", errors={"wait_seconds": [message]})
    pull: PullClaims = current_app.extensions["tickler.pull"]
    started = time.time_ns()
    leases = pull.claim(
        target,
        worker=f"{auth.principal().name}/{fields['worker']}",
        limit=fields["limit"],
        lease_seconds=fields.get("lease_seconds"),
        wait_seconds=fields["wait_seconds"],
    )
    if leases:  # the claim's `receive` span: in the consumer's trace, linked to the producers
        producers = [TraceContext.of_row(e) for lease in leases for e in lease.events]
        tracing.record(
            "receive",
            queue,
            started,
            parent=TraceContext.from_headers(request.headers),
            links=producers,
            messaging__batch__message_count=len(producers),
            messaging__consumer__group__name=fields["worker"],
        )
    return jsonify({"leases": [lease_to_json(lease) for lease in leases]})


def _settle(lease_id: str, queue: str | None, started: int, outcome: str, error: str | None = None) -> None:
    """The `settle` span of a pull consumer's ack or nack, in the consumer's trace (tracing on)."""
    tracing.record(
        "settle",
        queue or "",
        started,
        parent=TraceContext.from_headers(request.headers),
        error=error,
        error_type=outcome,
        tickler__lease_id=lease_id,
        tickler__outcome=outcome,
    )


def _trace_id() -> str | None:
    """The trace of the consumer's attempt, sent with its ack or nack: kept in the timeline."""
    found = TraceContext.from_headers(request.headers)
    return found.trace_id if found is not None else None


def _canonical(lease_id: str) -> str:
    """The lease id as the database spells a uuid; StaleLease (409) when it is none. Python's
    UUID also reads `urn:uuid:...` and `{...}`, which PostgreSQL refuses: hand it the canonical form."""
    try:
        return str(uuid.UUID(lease_id))
    except ValueError:
        raise StaleLease("No such lease.") from None


# What a 409 says about a lease that is no longer held, by its `lease_status` (see lease_fate).
_STALE_DETAIL = {
    "expired": "The lease expired before it was finished; its events will be delivered again.",
    "unknown": "The lease expired, was finished, or never existed.",
}


def _stale(lease_id: str) -> StaleLease:
    """The 409 for a lease that is no longer held, saying `expired` where the server can tell
    cheaply, so that a lost lease is told from an ack resent after a lost answer."""
    fate = context.store().leases.fate(lease_id)
    return StaleLease(_STALE_DETAIL[fate], lease_status=fate)


def _live_lease_queue(lease_id: str) -> str:
    """The queue of a live lease the caller may use; StaleLease (409) otherwise."""
    queue = context.store().leases.queue_of(lease_id)
    if queue is None:
        raise _stale(lease_id)
    if not auth.principal().can_use(queue):  # another tenant's lease: as if there were none
        raise StaleLease(_STALE_DETAIL["unknown"], lease_status="unknown")
    return queue


def _allowed_queues() -> list[str] | None:
    caller = auth.principal()
    return None if caller.is_admin else sorted(caller.queues)


@leases_bp.post("/<lease_id>/ack")
def ack(lease_id: str) -> Response:
    lease_id = _canonical(lease_id)
    started = time.time_ns()
    # One statement: the caller's queues are checked inside the ack itself.
    try:
        queue = context.store().leases.ack_one(lease_id, queues=_allowed_queues(), trace_id=_trace_id())
    except StaleLease:
        raise _stale(lease_id) from None
    _settle(lease_id, queue, started, Status.DELIVERED)
    return jsonify({"lease_id": lease_id, "status": Status.DELIVERED})


@leases_bp.post("/ack")
def ack_many() -> Response:
    """Ack up to 1,000 leases in one request and one statement; each answers delivered or stale."""
    fields = _ack_many_schema.load(context.json_body())
    lease_ids = list(dict.fromkeys(str(lease_id) for lease_id in fields["lease_ids"]))
    trace_id = _trace_id()
    done = context.store().leases.ack(
        lease_ids, queues=_allowed_queues(), trace_ids=dict.fromkeys(lease_ids, trace_id) if trace_id else None
    )
    results = [{"lease_id": i, "status": Status.DELIVERED if i in done else "stale"} for i in lease_ids]
    return jsonify({"results": results})


@leases_bp.post("/<lease_id>/nack")
def nack(lease_id: str) -> Response:
    lease_id = _canonical(lease_id)
    queue = _live_lease_queue(lease_id)
    fields = _nack_schema.load(context.json_body())
    started = time.time_ns()
    result = context.store().leases.nack(
        lease_id,
        error=fields["error"],
        retry_in_seconds=fields.get("retry_in_seconds"),
        dead=fields["dead"],
        trace_id=_trace_id(),
    )
    _settle(lease_id, queue, started, Status.DEAD if result.dead else "failed", fields["error"])
    return jsonify(
        {
            "lease_id": lease_id,
            "status": Status.DEAD if result.dead and not result.retried else "retrying",
            "dead": result.dead,
            "retrying": result.retried,
            "retry_at": format_timestamp(result.retry_at),
        }
    )


@leases_bp.post("/<lease_id>/extend")
def extend(lease_id: str) -> Response:
    lease_id = _canonical(lease_id)
    _live_lease_queue(lease_id)
    fields = _extend_schema.load(context.json_body())
    expires = context.store().leases.extend(lease_id, seconds=fields["seconds"])
    return jsonify({"lease_id": lease_id, "expires_at": format_timestamp(expires)})
