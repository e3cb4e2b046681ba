"""A real local asyncio webhook receiver that can hold requests open: thousands in flight at once,
answered when the test says (no sleeps), on a thread of its own."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection


@dataclass
class HoldingReceiver:
    url: str = ""
    hold: bool = True  # hold each request until released; False: answer 204 at once
    record: bool = True  # False: keep nothing of what arrives (a memory test's receiver stays level)
    arrivals: Counter[int] = field(default_factory=Counter)  # event id -> requests that carried it
    hosts: list[str] = field(default_factory=list)  # Host headers seen
    lock: threading.Lock = field(default_factory=threading.Lock)
    _held: list[tuple[list[int], asyncio.Future[None]]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def held(self) -> int:
        with self.lock:
            return sum(1 for _, answer in self._held if not answer.done())

    def release(self, which: Callable[[list[int]], bool] = lambda ids: True) -> None:
        """Answer the held requests whose event ids `which` accepts (204)."""
        assert self._loop is not None

        def answer() -> None:
            with self.lock:
                for ids, future in self._held:
                    if not future.done() and which(ids):
                        future.set_result(None)

        self._loop.call_soon_threadsafe(answer)

    def answer_at_once(self) -> None:
        self.hold = False
        self.release()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                ids = [event["id"] for event in json.loads(body)["events"]]
                with self.lock:
                    if self.record:
                        self.arrivals.update(ids)
                        self.hosts.append(headers.get("host", ""))
                    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    if self.hold:
                        self._held.append((ids, future))
                    else:
                        future.set_result(None)
                await future
                writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextmanager
def holding_receiver(host: str = "127.0.0.1") -> Iterator[HoldingReceiver]:
    receiver = HoldingReceiver()
    loop = asyncio.new_event_loop()
    receiver._loop = loop
    started = threading.Event()
    server: list[asyncio.Server] = []

    async def start() -> None:
        server.append(await asyncio.start_server(receiver._serve, host, 0, backlog=2048))
        port = server[0].sockets[0].getsockname()[1]
        receiver.url = f"http://{host}:{port}/hooks"
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield receiver
    finally:
        receiver.answer_at_once()

        async def stop() -> None:
            server[0].close()
            await server[0].wait_closed()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _answer_in_this_process(pipe: Connection) -> None:
    with holding_receiver() as receiver:
        receiver.hold, receiver.record = False, False
        pipe.send(receiver.url)
        pipe.recv()  # until the test is done


@contextmanager
def answering_receiver_process() -> Iterator[str]:
    """A receiver that answers every request at once and keeps nothing, in a process of its own:
    the test's process measures only its own side (memory, CPU), and the two sides do not take
    turns on one interpreter lock. Yields its URL."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_answer_in_this_process, args=(theirs,), daemon=True)
    process.start()
    try:
        if not ours.poll(30):
            raise RuntimeError("the receiver process did not start")
        yield ours.recv()
    finally:
        ours.send("stop")
        process.join(10)
        if process.is_alive():
            process.kill()
