"""Sending calls to a tickler server over httpx, blocking or with asyncio: authentication,
connect and read timeouts, error mapping and the retries of calls that are safe to repeat.

Every client method is written once, as a function that builds a `Call` (the request, and how to
read its answer); `Transport.send` and `AsyncTransport.send` are the only two places that send
one, so the two clients cannot drift apart in what they ask or how they read the answers."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import httpx

from tickler_client._tracing import current_headers
from tickler_client.errors import ServiceUnavailable, StaleLease, TransportError, ValidationError, error_for

T = TypeVar("T")

# Never wait longer than this between two tries, whatever Retry-After says: a caller blocked for
# minutes inside one call is worse than an exception it can handle.
MAX_RETRY_WAIT = 30.0

# Failures after which the server may or may not have acted: the request is sent again only when
# the call is safe to repeat.
NO_ANSWER = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def segment(value: str) -> str:
    """A key or name as one percent-encoded path segment (`:`, `@`, `+`, spaces, non-ASCII)."""
    return quote(value, safe="")


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how its answer is read. `safe`: may be sent again after no answer or a 503.
    `lease_call`: a 409 means the lease is stale. `extra_wait` lengthens the read timeout of a
    call that waits on the server (a long-polling claim)."""

    method: str
    path: str
    read: Callable[[Answer], T]
    json: Any = None
    params: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    safe: bool = False
    lease_call: bool = False
    extra_wait: float = 0.0


class Paged(Protocol):
    """A page of a listing: the cursor of the next page (None: this is the last)."""

    @property
    def next_cursor(self) -> str | None: ...


PageT = TypeVar("PageT", bound=Paged)


@dataclass(frozen=True)
class Pages(Generic[PageT, T]):
    """A listing read page after page: `call(cursor)` builds the call for one page (None: the
    first), `items(page)` is what that page lists. The clients build the first call only when the
    iteration starts, so an argument they refuse (a naive datetime) is refused there."""

    call: Callable[[str | None], Call[PageT]]
    items: Callable[[PageT], list[T]]

    def after(self, page: PageT) -> Call[PageT] | None:
        """The call for the page after `page` (None: it was the last)."""
        return None if page.next_cursor is None else self.call(page.next_cursor)


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    # An HTTP date is always GMT (RFC 9110 §5.6.7): a zone the parser could not tell is UTC.
    return max(0.0, (when.replace(tzinfo=when.tzinfo or UTC) - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True)
class Settings:
    """What both transports are built from."""

    base_url: str
    token: str
    connect_timeout: float
    read_timeout: float
    retries: int
    retry_backoff: float
    user_agent: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json", "User-Agent": self.user_agent}

    def timeout(self, extra_wait: float = 0.0) -> httpx.Timeout:
        read = self.read_timeout + extra_wait
        return httpx.Timeout(connect=self.connect_timeout, read=read, write=self.read_timeout, pool=read)


class _Attempts:
    """The retry rules of one call, shared by both transports: how many tries, what an answer or
    a failure means, and how long to wait before the next try."""

    def __init__(self, settings: Settings, call: Call[Any]) -> None:
        self.settings = settings
        self.call = call
        self.tries = 1 + (settings.retries if call.safe else 0)
        self.unanswered = False  # an earlier try got no answer: the server may have acted on it

    def failed(self, attempt: int, failure: Exception) -> float:
        """No answer: the wait before the next try, or raise when this was the last one."""
        self.unanswered = True
        if attempt == self.tries - 1:
            where = self.settings.base_url
            raise TransportError(f"{self.call.method} {self.call.path}: no answer from {where}: {failure}") from failure
        return self._backoff(attempt, None)

    def answered(self, attempt: int, response: httpx.Response) -> Answer | float:
        """The answer of a success; the wait before the next try after a 503; else raise."""
        answer = Answer(response.status_code, dict(response.headers), _decode(response))
        if answer.status < 400:
            return answer
        retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        error = error_for(answer.status, answer.body, lease_call=self.call.lease_call, retry_after=retry_after)
        if isinstance(error, ServiceUnavailable) and attempt < self.tries - 1:
            return self._backoff(attempt, retry_after)
        if isinstance(error, StaleLease) and self.unanswered:
            error.after_unanswered_try = True
        raise error

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        wait = retry_after if retry_after is not None else self.settings.retry_backoff * 2**attempt
        return min(wait, MAX_RETRY_WAIT)

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        call = self.call
        headers = call.headers
        traced = current_headers()  # the caller's trace context, when OpenTelemetry is installed
        if traced:
            headers = {**traced, **(headers or {})}
        try:
            return client.build_request(
                call.method,
                call.path,
                json=call.json,
                params=call.params,
                headers=headers,
                timeout=self.settings.timeout(call.extra_wait),
            )
        except (TypeError, ValueError) as refused:  # NaN, a datetime in data: JSON has no such values
            message = f"Cannot be sent as JSON: {refused}."
            raise ValidationError(message, errors={"body": [message]}) from None


class Transport:
    """Sends calls and waits for their answers (one connection pool; httpx's Client may be
    shared between threads)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, headers=settings.headers(), timeout=settings.timeout())

    def clone(self) -> Transport:
        """Another transport to the same server with the same settings and connections of its own."""
        return Transport(self.settings)

    def close(self) -> None:
        self.http.close()

    def send(self, call: Call[T]) -> T:
        """Send once, or up to `1 + retries` times when the call is safe; raise the mapped error."""
        attempts = _Attempts(self.settings, call)
        for attempt in range(attempts.tries):
            try:
                response = self.http.send(attempts.request(self.http))
            except NO_ANSWER as failure:
                time.sleep(attempts.failed(attempt, failure))
                continue
            outcome = attempts.answered(attempt, response)
            if isinstance(outcome, Answer):
                return call.read(outcome)
            time.sleep(outcome)
        raise AssertionError("unreachable: the last try returns or raises")


class AsyncTransport:
    """`Transport` for asyncio: the same calls, retries and errors, awaited."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=settings.headers(), timeout=settings.timeout())

    async def close(self) -> None:
        await self.http.aclose()

    async def send(self, call: Call[T]) -> T:
        attempts = _Attempts(self.settings, call)
        for attempt in range(attempts.tries):
            try:
                response = await self.http.send(attempts.request(self.http))
            except NO_ANSWER as failure:
                await asyncio.sleep(attempts.failed(attempt, failure))
                continue
            outcome = attempts.answered(attempt, response)
            if isinstance(outcome, Answer):
                return call.read(outcome)
            await asyncio.sleep(outcome)
        raise AssertionError("unreachable: the last try returns or raises")


def _decode(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}
