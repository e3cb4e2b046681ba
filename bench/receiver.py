"""A no-op webhook receiver: asyncio, keep-alive, answers 204 to every POST. Run as a process."""

from __future__ import annotations

import asyncio
from typing import Any


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

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
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")


def serve(port: int, ready: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Protocol, "127.0.0.1", port, backlog=512)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())
