"""An asyncio event loop on a thread of its own, fed from other threads: where webhook requests run.

Thousands of requests waiting on slow receivers cost a task each (a few kilobytes, see
docs/delivery.md), not a thread each; the dispatcher's claim loop and the finisher stay threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import structlog

log = structlog.get_logger(__name__)

Job = Coroutine[Any, Any, None]


class LoopThread:
    def __init__(self, name: str = "tickler-webhooks") -> None:
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, jobs: Sequence[Job]) -> None:
        """Start these coroutines as tasks on the loop (from any thread; one wake-up per call)."""
        self._loop.call_soon_threadsafe(self._spawn, list(jobs))

    def _spawn(self, jobs: list[Job]) -> None:
        for job in jobs:
            task = self._loop.create_task(job)
            self._tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery_task_error", error=repr(task.exception()))

    def stop(self, closing: Callable[[], Coroutine[Any, Any, None]] | None = None, *, timeout: float = 10.0) -> None:
        """Cancel the tasks still running (their requests end; they record no outcome), run
        `closing` (the HTTP client's close), then end the loop and its thread."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            tasks = [task for task in self._tasks if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if closing is not None:
                await closing()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout)
        except FutureTimeout:
            log.warning("webhook_loop_stop_timeout", tasks=len(self._tasks))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
