"""Turning the call builders into client methods: one definition of each call (its arguments,
docstring, request and answer), bound to a blocking client by `blocking` and to an asyncio client
by `awaiting` (a listing read page after page: `blocking_pages`, `awaiting_pages`) — so the two
clients offer the same calls by construction, not by copying. Both clients also take their
connection settings in one place, `Connected`."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from tickler_client._http import AsyncTransport, Call, Pages, PageT, Settings, Transport
from tickler_client._version import __version__

P = ParamSpec("P")
T = TypeVar("T")
TransportT = TypeVar("TransportT", Transport, AsyncTransport)

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0


class Connected(Generic[TransportT]):
    """What both clients share: the connection settings they take (`timeout` sets both
    timeouts, the specific ones win over it) and the transport their methods send through."""

    _transport: TransportT

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        retries: int = 3,
        retry_backoff: float = 0.25,
    ) -> None:
        self._transport = self._connect(
            Settings(
                base_url=base_url,
                token=token,
                connect_timeout=connect_timeout or timeout or DEFAULT_CONNECT_TIMEOUT,
                read_timeout=read_timeout or timeout or DEFAULT_READ_TIMEOUT,
                retries=retries,
                retry_backoff=retry_backoff,
                user_agent=f"tickler-client/{__version__}",
            )
        )

    def _connect(self, settings: Settings) -> TransportT:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


class Sends(Connected[Transport]):
    """A blocking client's base: it holds the transport its methods send through."""

    def _connect(self, settings: Settings) -> Transport:
        return Transport(settings)

    def _every(self, pages: Pages[PageT, T]) -> Iterator[T]:
        """Every item of the listing, asking for each page as the iteration reaches it."""
        call: Call[PageT] | None = pages.call(None)
        while call is not None:
            page = self._transport.send(call)
            yield from pages.items(page)
            call = pages.after(page)


class AwaitsSends(Connected[AsyncTransport]):
    """An asyncio client's base."""

    def _connect(self, settings: Settings) -> AsyncTransport:
        return AsyncTransport(settings)

    async def _every(self, pages: Pages[PageT, T]) -> AsyncIterator[T]:
        """The same, as an async iterator."""
        call: Call[PageT] | None = pages.call(None)
        while call is not None:
            page = await self._transport.send(call)
            for item in pages.items(page):
                yield item
            call = pages.after(page)


def blocking(build: Callable[P, Call[T]]) -> Callable[Concatenate[Sends, P], T]:
    """A method that sends the call `build` makes and returns what its answer reads as."""

    @functools.wraps(build)
    def method(self: Sends, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._transport.send(build(*args, **kwargs))

    return method


def awaiting(build: Callable[P, Call[T]]) -> Callable[Concatenate[AwaitsSends, P], Coroutine[Any, Any, T]]:
    """The same method as a coroutine."""

    @functools.wraps(build)
    async def method(self: AwaitsSends, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._transport.send(build(*args, **kwargs))

    return method


def blocking_pages(build: Callable[P, Pages[Any, T]]) -> Callable[Concatenate[Sends, P], Iterator[T]]:
    """A method that iterates over every item of the listing `build` describes."""

    @functools.wraps(build)
    def method(self: Sends, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._every(build(*args, **kwargs))

    return method


def awaiting_pages(build: Callable[P, Pages[Any, T]]) -> Callable[Concatenate[AwaitsSends, P], AsyncIterator[T]]:
    """The same method as an async iterator."""

    @functools.wraps(build)
    def method(self: AwaitsSends, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        return self._every(build(*args, **kwargs))

    return method
