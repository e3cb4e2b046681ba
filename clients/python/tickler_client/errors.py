"""tickler's problem+json answers as exceptions, with every field the server sent kept intact."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tickler_client.models import Event


class TicklerError(Exception):
    """Base of every error this client raises.

    `status` is the HTTP status (0 when no answer came), `title`, `detail` and `type` come from the
    problem+json body, `errors` maps each refused field to its messages, and `problem` is the whole
    body as sent.

    >>> try:
    ...     client.get("emails", "never-seen")
    ... except TicklerError as error:
    ...     print(error.status, error.detail)
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int = 0,
        title: str = "",
        type: str = "about:blank",
        errors: dict[str, list[str]] | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" if status else detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.errors: dict[str, list[str]] = errors or {}
        self.problem: dict[str, Any] = problem or {}

    def __str__(self) -> str:
        """What a traceback shows: the status and title, the detail unless it only repeats the
        title, and each refused field with its reasons (the part a person acts on).

        "400 The request is not valid: delay_seconds: Must be greater than or equal to 0."
        """
        said = [self.title] if self.status and self.title else []
        if self.detail and self.detail.rstrip(".") != self.title.rstrip("."):
            said.append(self.detail)
        text = ": ".join(said) or self.detail
        if self.status:
            text = f"{self.status} {text}"
        if self.errors:
            reasons = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in self.errors.items())
            text = f"{text.rstrip('.')}: {reasons}"
        return text


class ValidationError(TicklerError):
    """400: the request was refused and nothing was written; `errors` names each field. Also
    raised by the client itself, before any request, for what it can tell is wrong (a naive
    datetime, a NaN in `data`): then `status` is 0.

    >>> try:
    ...     client.schedule("emails", "k", delay=-1)
    ... except ValidationError as error:
    ...     error.errors  # {"delay_seconds": ["Must be greater than or equal to 0."]}
    """


class Unauthorized(TicklerError):
    """401: no token, or a token the server does not know (revoked, mistyped)."""


class Forbidden(TicklerError):
    """403: the token is valid but may not do this (an admin call with a queue token)."""


class NotFound(TicklerError):
    """404: no such event, key, schedule or queue — or a queue this token may not see.

    >>> try:
    ...     client.cancel("emails", "welcome:ana@example.com")
    ... except NotFound:
    ...     pass  # nothing open under that key
    """


class Conflict(TicklerError):
    """409: an open event already holds the key, the event is in flight, or the queue is busy.

    `event` is the event the server sent along (the existing one, for a rejected schedule), if any.

    >>> try:
    ...     client.schedule("emails", "welcome:ana@example.com", data={})
    ... except Conflict as conflict:
    ...     conflict.event.schedule_on  # when the one already scheduled is due
    """

    def __init__(self, detail: str, *, event: Event | None = None, **fields: Any) -> None:
        super().__init__(detail, **fields)
        self.event = event


class StaleLease(Conflict):
    """409 on a lease call: the lease expired, was finished, or was claimed again by someone else.

    `lease_status` says which, where it can be known: `expired` (its time ran out; the server
    says so while nobody claimed its events since), or — for an `ack` or `nack` given the
    `Lease` itself, read from its key's timeline — `delivered` (acked already: what an ack
    resent after a lost answer finds), `retrying` or `dead` (nacked already); else `unknown`
    (claimed again by another worker, or never a lease). `already_finished` is True when this
    very lease finished its events. `after_unanswered_try` is True when an earlier try of this
    call got no answer (the call may itself have landed).

    >>> try:
    ...     client.ack(lease)
    ... except StaleLease as stale:
    ...     if not stale.already_finished:
    ...         log.warning("lease lost: its events will be delivered again")
    """

    def __init__(self, detail: str, *, lease_status: str = "unknown", **fields: Any) -> None:
        super().__init__(detail, **fields)
        self.lease_status = lease_status
        self.after_unanswered_try = False

    @property
    def already_finished(self) -> bool:
        return self.lease_status in ("delivered", "retrying", "dead")


class PreconditionFailed(TicklerError):
    """412: `if_version` did not match — the event changed since it was read.

    >>> try:
    ...     client.reschedule("emails", key, delay=60, if_version=event.version)
    ... except PreconditionFailed:
    ...     event = client.get("emails", key)  # read again, decide again
    """


class PayloadTooLarge(TicklerError):
    """413: an event's `data` or the request body is over the server's limit."""


class ServiceUnavailable(TicklerError):
    """503: the server cannot serve now (its database is unreachable); `retry_after` in seconds.

    >>> try:
    ...     client.cancel("emails", key)
    ... except ServiceUnavailable as error:
    ...     time.sleep(error.retry_after or 1)
    """

    def __init__(self, detail: str, *, retry_after: float | None = None, **fields: Any) -> None:
        super().__init__(detail, **fields)
        self.retry_after = retry_after


class ServerError(TicklerError):
    """Any other answer the client does not expect (a 500, a proxy's 502, ...)."""


class TransportError(TicklerError):
    """No answer: the connection was refused or dropped, or the request timed out.

    For a call that is not safe to repeat, the server may or may not have acted on it: read the
    event (`client.get`) before trying again.
    """


class WebhookVerificationError(TicklerError):
    """`verify_webhook` refused a delivery: bad or missing signature, or a stale timestamp."""


_BY_STATUS: dict[int, type[TicklerError]] = {
    400: ValidationError,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    503: ServiceUnavailable,
}


def error_for(status: int, body: Any, *, lease_call: bool = False, retry_after: float | None = None) -> TicklerError:
    """The exception for an error answer; `body` is the decoded problem+json (or anything else)."""
    from tickler_client.models import parse_event

    problem: dict[str, Any] = body if isinstance(body, dict) else {}
    title = str(problem.get("title", ""))
    detail = str(problem.get("detail") or title or f"HTTP {status}")
    raw_errors = problem.get("errors")
    errors = (
        {str(k): [str(m) for m in v] if isinstance(v, list) else [str(v)] for k, v in raw_errors.items()}
        if isinstance(raw_errors, dict)
        else {}
    )
    fields: dict[str, Any] = {
        "status": status,
        "title": title,
        "type": str(problem.get("type", "about:blank")),
        "errors": errors,
        "problem": problem,
    }
    if status == 409 and lease_call:
        return StaleLease(detail, lease_status=str(problem.get("lease_status") or "unknown"), **fields)
    if status == 409:
        event = problem.get("event")
        return Conflict(detail, event=parse_event(event) if isinstance(event, dict) else None, **fields)
    if status == 503:
        return ServiceUnavailable(detail, retry_after=retry_after, **fields)
    return _BY_STATUS.get(status, ServerError)(detail, **fields)
