"""The peer: pgqueuer (PyPI, `pip install -e '.[bench]'`), driven through its public API only.

Its schema is installed by its own `Queries.install()` into a database of its own. Enqueues use
`SyncQueries.enqueue` on an autocommit psycopg connection (its synchronous producer API), with a
dedupe key standing for tickler's natural key; workers are `QueueManager.run` with an async no-op
entrypoint, one process each. A finished job leaves the queue table and gets a `pgqueuer_log` row
('successful'), whose `created` stamp is the finish time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

import psycopg

from bench.harness import poll, value
from bench.procs import running

ENTRYPOINT = "bench"
TABLE = "pgqueuer"
LOG = "pgqueuer_log"


def install(url: str) -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()

    asyncio.run(go())


class Producer:
    """SyncQueries on one autocommit connection."""

    def __init__(self, url: str) -> None:
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        self.conn = psycopg.connect(url, autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.conn))

    def one(self, key: str, payload: dict[str, Any], *, delay: float = 3600.0) -> None:
        body = json.dumps(payload).encode()
        self.queries.enqueue(ENTRYPOINT, body, execute_after=timedelta(seconds=delay), dedupe_key=key)

    def many(
        self, keys: Sequence[str], *, delay: float = 3600.0, payloads: Sequence[dict[str, Any]] | None = None
    ) -> None:
        """One statement for the whole list (pgqueuer's batch enqueue); payloads: {"n": key} when not given."""
        n = len(keys)
        self.queries.enqueue(
            [ENTRYPOINT] * n,
            [json.dumps(payloads[i] if payloads else {"n": k}).encode() for i, k in enumerate(keys)],
            [0] * n,
            [timedelta(seconds=delay)] * n,
            list(keys),
        )

    def close(self) -> None:
        self.conn.close()


def wait_until_drained(url: str) -> None:
    poll(lambda: value(url, f"SELECT count(*) = 0 FROM {TABLE}"), what="pgqueuer: jobs still queued")


def finish_time(url: str) -> float:
    return float(value(url, f"SELECT extract(epoch FROM max(created))::float8 FROM {LOG} WHERE status = 'successful'"))


def _worker(url: str, batch: int, record: str, ready: Any, stop: Any) -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    seen: list[tuple[float, float]] = []

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def handle(job: Job) -> None:
            if record:
                seen.append((time.time(), job.execute_after.timestamp()))

        async def stopper() -> None:
            await asyncio.to_thread(stop.wait)
            qm.shutdown.set()

        task = asyncio.create_task(stopper())
        ready.set()
        await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=5))
        await task

    asyncio.run(main())
    if record:
        with open(record, "w") as out:
            json.dump(seen, out)


@contextmanager
def workers(url: str, count: int, batch: int, *, record: str = "", settle: float = 1.0) -> Iterator[list[BaseProcess]]:
    """`count` pgqueuer worker processes for the block (stopped through QueueManager.shutdown);
    settle: each has verified its schema and listens."""
    args = [(url, batch, record if i == 0 else "") for i in range(count)]
    with running(_worker, args, what="pgqueuer worker", settle=settle) as procs:
        yield procs


def fill(url: str, keys: Sequence[str], payloads: Sequence[dict[str, Any]]) -> None:
    """Jobs an hour ahead, 10,000 a statement."""
    with closing(Producer(url)) as producer:
        for start in range(0, len(keys), 10_000):
            producer.many(keys[start : start + 10_000], payloads=payloads[start : start + 10_000])
