"""One HTTP session to a tickler server: authentication, timeouts, error mapping and the retries
of calls that are safe to repeat."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import requests

from tickler_client._tracing import current_headers
from tickler_client.errors import ServiceUnavailable, TransportError, error_for

# Never wait longer than this between two tries, whatever Retry-After says: a caller blocked for
# minutes inside one call is worse than an exception it can handle.
MAX_RETRY_WAIT = 30.0


def segment(value: str) -> str:
    """A key or name as one percent-encoded path segment (`:`, `@`, `+`, spaces, non-ASCII)."""
    return quote(value, safe="")


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


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


class Transport:
    """Sends requests; `safe=True` marks a call that may be repeated after no answer or a 503."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float, retries: int, retry_backoff: float, user_agent: str
    ) -> None:
        self._args = (base_url, token)
        self.user_agent = user_agent
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": user_agent}
        )

    def clone(self) -> Transport:
        """Another transport to the same server with the same settings and a session of its own."""
        base_url, token = self._args
        return Transport(
            base_url,
            token,
            timeout=self.timeout,
            retries=self.retries,
            retry_backoff=self.retry_backoff,
            user_agent=self.user_agent,
        )

    def close(self) -> None:
        self.session.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        safe: bool = False,
        lease_call: bool = False,
        extra_wait: float = 0.0,
    ) -> Answer:
        """Send once, or up to `1 + retries` times when `safe`; raise the mapped error on 4xx/5xx.

        `extra_wait` lengthens the read timeout for calls that wait on the server (long polls)."""
        tries = 1 + (self.retries if safe else 0)
        traced = current_headers()  # the caller's trace context, when OpenTelemetry is installed
        if traced:
            headers = {**traced, **(headers or {})}
        for attempt in range(tries):
            last = attempt == tries - 1
            try:
                response = self.session.request(
                    method,
                    self.base_url + path,
                    json=json,
                    params=params,
                    headers=headers,
                    timeout=(self.timeout, self.timeout + extra_wait),
                )
            except (requests.ConnectionError, requests.Timeout) as failure:
                if last:
                    raise TransportError(f"{method} {path}: no answer from {self.base_url}: {failure}") from failure
                time.sleep(self._backoff(attempt, None))
                continue
            answer = Answer(response.status_code, dict(response.headers), _decode(response))
            if answer.status < 400:
                return answer
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            error = error_for(answer.status, answer.body, lease_call=lease_call, retry_after=retry_after)
            if isinstance(error, ServiceUnavailable) and not last:
                time.sleep(self._backoff(attempt, retry_after))
                continue
            raise error
        raise AssertionError("unreachable: the last try returns or raises")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        wait = retry_after if retry_after is not None else self.retry_backoff * 2**attempt
        return min(wait, MAX_RETRY_WAIT)


def _decode(response: requests.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}
