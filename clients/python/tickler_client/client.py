"""The client: one object per tickler server and token."""

from __future__ import annotations

from types import TracebackType

from tickler_client._events import EventsAPI
from tickler_client._http import Transport
from tickler_client._leases import LeasesAPI
from tickler_client._queues import QueuesAPI, SchedulesAPI
from tickler_client._version import __version__


class Client(EventsAPI, LeasesAPI, QueuesAPI, SchedulesAPI):
    """A tickler server, reached with one token. Give each thread its own Client: it holds one
    HTTP session (keep-alive connections), which requests does not promise to be safe to share
    between threads. Cheap to create; close it, or use it as a context manager.

    `timeout` bounds connecting and each read, in seconds (a long-polling claim waits longer by
    its `wait_seconds`). Calls that are safe to repeat (each method's docstring says) are retried
    up to `retries` times after no answer or a 503, waiting `retry_backoff * 2**n` seconds or the
    server's `Retry-After`; every other call raises at once.

    >>> with Client("http://127.0.0.1:8080", token) as client:
    ...     client.schedule("emails", "welcome:ana@example.com", {"template": "welcome"}, delay=86400)
    """

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 30.0, retries: int = 3, retry_backoff: float = 0.25
    ) -> None:
        self._transport = Transport(
            base_url,
            token,
            timeout=timeout,
            retries=retries,
            retry_backoff=retry_backoff,
            user_agent=f"tickler-client/{__version__}",
        )

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    def close(self) -> None:
        """Close the HTTP connections (also done on leaving a `with` block)."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"
