"""An in-process Worker for tests whose one handler records the ids of the events it is given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tickler.config import Settings
from tickler.scheduler.models import Event
from tickler.scheduler.worker import Worker


@contextmanager
def recording_worker(
    database_url: str, queue: str, work: Callable[[Event], object], *, name: str
) -> Iterator[list[int]]:
    """A started Worker whose handler of `queue` records each event's id, then does `work` on it;
    it reaps every 0.2 s, so that lease extensions and retried acks come soon. Stopped on the way
    out; yields the recorded ids."""
    calls: list[int] = []
    worker = Worker(settings=Settings(database_url=database_url, migrate_on_start=False), name=name, reap_interval=0.2)

    @worker.handler(queue)
    def handle(event: Event) -> None:
        calls.append(event.id)
        work(event)

    worker.start()
    try:
        yield calls
    finally:
        worker.stop()
