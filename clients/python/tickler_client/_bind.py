"""Turning the call builders into client methods: one definition of each call (its arguments,
docstring, request and answer), bound to a blocking client by `blocking` and to an asyncio client
by `awaiting` — so the two clients offer the same calls by construction, not by copying."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from tickler_client._http import AsyncTransport, Call, Transport

P = ParamSpec("P")
T = TypeVar("T")


class Sends:
    """A blocking client's base: it holds the transport its methods send through."""

    _transport: Transport


class AwaitsSends:
    """An asyncio client's base."""

    _transport: AsyncTransport


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
