"""Fixtures of the Python client's tests: `tickler_client.Client`s talking to the real app served
over a real threaded HTTP server (`live_server`).

Every test written against the `tickler`, `admin` or `make_client` fixtures runs twice: with the
blocking `Client`, and with the `AsyncClient` driven through `Blocking` — so the asyncio client
passes the very same behaviour tests (answers, errors, retries, the consume loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import pytest
from tickler_client import AsyncClient, Client, ConsumeStats, Lease


class MakeClient(Protocol):
    def __call__(self, base_url: str, token: str, **options: Any) -> Client: ...


class Blocking:
    """An `AsyncClient` behind the blocking client's interface, for running the same tests: its
    coroutines run on an event loop of its own thread, and each call waits for its result
    (exceptions included). `consume` runs `AsyncClient.consume` with `asyncio.run` in the calling
    thread (so the signal handling is the asyncio loop's own), the handler on a worker thread."""

    def __init__(self, base_url: str, token: str, **options: Any) -> None:
        self._args, self._options = (base_url, token), options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="async-client-loop", daemon=True)
        self._thread.start()
        self._client = self._await(self._create())

    async def _create(self) -> AsyncClient:
        return AsyncClient(*self._args, **self._options)

    def _await(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *args, **kwargs: self._await(method(*args, **kwargs))

    @property
    def base_url(self) -> str:
        return self._client.base_url

    def search(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        pages: AsyncIterator[Any] = self._client.search(*args, **kwargs)
        while True:
            try:
                yield self._await(pages.__anext__())
            except StopAsyncIteration:
                return

    def consume(
        self,
        queue: str,
        handler: Callable[[Lease], object],
        *,
        stop: threading.Event | None = None,
        **options: Any,
    ) -> ConsumeStats:
        async def run() -> ConsumeStats:
            astop = asyncio.Event()
            if stop is not None:
                loop = asyncio.get_running_loop()
                threading.Thread(
                    target=lambda: (stop.wait(), loop.call_soon_threadsafe(astop.set)), daemon=True
                ).start()

            async def handle(lease: Lease) -> None:
                await asyncio.to_thread(handler, lease)

            async with AsyncClient(*self._args, **self._options) as client:
                return await client.consume(queue, handle, stop=astop, **options)

        return asyncio.run(run())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._await(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Blocking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(params=["Client", "AsyncClient"])
def make_client(request: pytest.FixtureRequest) -> Iterator[MakeClient]:
    """Clients of the kind under test (closed at the end of the test)."""
    made: list[Any] = []

    def make(base_url: str, token: str, **options: Any) -> Client:
        kind: Any = Client if request.param == "Client" else Blocking
        client = kind(base_url, token, **options)
        made.append(client)
        return client  # type: ignore[no-any-return]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def admin(live_server: str, admin_token: str, make_client: MakeClient) -> Client:
    """A client with an admin token."""
    return make_client(live_server, admin_token, timeout=10, retry_backoff=0.01)


@pytest.fixture
def tickler(live_server: str, token: str, admin: Client, make_client: MakeClient) -> Client:
    """The signup service's client: its token may use the pull queue `emails`, created here."""
    admin.put_queue("emails", delivery="pull", backoff_initial_seconds=0.05, backoff_max_seconds=0.05)
    return make_client(live_server, token, timeout=10, retry_backoff=0.01)
