"""A webhook receiver that cannot be the bottleneck: asyncio, keep-alive, answers 204 to every
POST, after `delay` seconds (0: at once) without holding anything but a timer per request. It
counts the requests it holds at once (`in_flight`, shared with the parent). Run as a process."""

from __future__ import annotations

import asyncio
from typing import Any


class _Protocol(asyncio.Protocol):
    def __init__(self, delay: float, gauge: Any) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.delay = delay
        self.gauge = gauge  # [now, max] requests held, when counting

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = 0
            for line in self.buffer[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            if self.delay:
                self.gauge[0] += 1
                self.gauge[1] = max(self.gauge[1], self.gauge[0])
                asyncio.get_running_loop().call_later(self.delay, self._answer)
            else:
                self._answer()

    def _answer(self) -> None:
        if self.delay:
            self.gauge[0] -= 1
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")


def serve(port: int, ready: Any, delay: float = 0.0, gauge: Any = None) -> None:
    """`gauge`: a shared array of two ints, [held now, most held at once]."""
    counts = gauge if gauge is not None else [0, 0]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Protocol(delay, counts), "127.0.0.1", port, backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())
