"""What only the asyncio client has, used natively from `asyncio.run` (its behaviour on every
call is the blocking client's: the client tests run against both, see client_fixtures.py):
many calls at once on one client, `async for` over search, `async with`, a coroutine handler in
`consume`, and the separate connect and read timeouts."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from tickler_client import AsyncClient, Client, Lease, TransportError


def test_many_calls_at_once_on_one_client(live_server: str, token: str, emails: str) -> None:
    async def main() -> list[str]:
        async with AsyncClient(live_server, token) as client:
            await asyncio.gather(*(client.schedule("emails", f"k{i:02}", {"i": i}, delay=60) for i in range(20)))
            return [event.item_key async for event in client.search("emails", page_size=7)]

    assert sorted(asyncio.run(main())) == [f"k{i:02}" for i in range(20)]


def test_consume_with_a_coroutine_handler(live_server: str, token: str, emails: str) -> None:

    async def main() -> tuple[list[str], int, set[str]]:
        stop = asyncio.Event()
        handled: list[str] = []

        async def handler(lease: Lease) -> None:
            await asyncio.sleep(0)  # a real coroutine: awaits while the loop serves others
            handled.append(lease.events[0].item_key)
            if len(handled) == 2:
                stop.set()

        async with AsyncClient(live_server, token) as client:
            await client.schedule("emails", "a")
            await client.schedule("emails", "b")
            stats = await client.consume("emails", handler, wait_seconds=1, stop=stop, handle_signals=False)
            statuses = {(await client.get("emails", key)).status for key in "ab"}
        return handled, stats.acked, statuses

    handled, acked, statuses = asyncio.run(main())
    assert sorted(handled) == ["a", "b"] and acked == 2 and statuses == {"delivered"}


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_the_read_timeout_is_its_own(silent_server: str) -> None:
    # Connecting succeeds at once (the kernel accepts), so only the read timeout can end the wait:
    # a long connect timeout must not stretch it.
    with (
        Client(silent_server, "t", connect_timeout=60, read_timeout=0.2, retries=0) as client,
        pytest.raises(TransportError, match="no answer"),
    ):
        client.get("emails", "k")

    async def main() -> None:
        async with AsyncClient(silent_server, "t", connect_timeout=60, read_timeout=0.2, retries=0) as client:
            await client.get("emails", "k")

    with pytest.raises(TransportError, match="no answer"):
        asyncio.run(main())
