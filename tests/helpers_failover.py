"""The failover tests' parts (tests/test_replica_failover*.py): a primary with a synchronous
standby (tests/pg_cluster.py), clients scheduling over HTTP without pause, kill -9 of the primary
and promotion of the standby, and the check that every event answered 2xx is delivered, twice
only with its redelivery counted."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import pg_cluster
from tests.helpers_wait import wait_until
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.errors import NotFound
from tickler.scheduler.store import QueueSettings, Store


@dataclass
class Pair:
    """A primary and its standby; url() lists both, the primary first."""

    root: Path
    primary: pg_cluster.Node
    standby: pg_cluster.Node

    def url(self, dbname: str = "tickler") -> str:
        hosts = f"{self.primary.host()},{self.standby.host()}"
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A migrated primary with a synchronous standby (synchronous_standby_names = '*'): a commit
    is answered once the standby has it."""
    root = pg_cluster.make_root()
    try:
        primary, standby = pg_cluster.synchronous_pair(root)
        try:
            yield Pair(root, primary, standby)
        finally:
            for node in (primary, standby):
                node.stop()
    finally:
        pg_cluster.remove_root(root)


@dataclass
class Answers:
    """What the clients were answered: (item_key, status, Retry-After, monotonic time)."""

    items: list[tuple[str, int, str | None, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, status: int, retry_after: str | None) -> None:
        with self.lock:
            self.items.append((key, status, retry_after, time.monotonic()))

    def snapshot(self) -> list[tuple[str, int, str | None, float]]:
        with self.lock:
            return list(self.items)

    def accepted(self, after: float = 0.0) -> list[str]:
        return [key for key, status, _, at in self.snapshot() if 200 <= status < 300 and at >= after]

    def refused_after(self, at: float) -> int:
        return sum(1 for _, status, _, when in self.snapshot() if status == 503 and when > at)


@dataclass
class Delivered:
    """What a worker delivered: (item_key, redeliver_count, monotonic time)."""

    items: list[tuple[str, int, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, redeliver_count: int) -> None:
        with self.lock:
            self.items.append((key, redeliver_count, time.monotonic()))

    def snapshot(self) -> list[tuple[str, int, float]]:
        with self.lock:
            return list(self.items)

    def keys(self) -> set[str]:
        return {key for key, _, _ in self.snapshot()}

    def after(self, at: float) -> int:
        return sum(1 for _, _, when in self.snapshot() if when > at)


def _schedule_until(
    stop: threading.Event, base: str, token: str, client_no: int, answers: Answers, queue: str, groups: int
) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        n = 0
        while not stop.is_set():
            key = f"c{client_no}-{n}"
            body: dict[str, Any] = {"item_key": key, "data": {"n": n}}
            if groups:
                body["group_key"] = f"g{n % groups}"
            n += 1
            try:
                response = http.post(f"/v1/queues/{queue}/events", json=body)
            except httpx.TransportError:
                answers.add(key, 0, None)  # the API itself never went away: counted as a failure below
                continue
            answers.add(key, response.status_code, response.headers.get("Retry-After"))
            if response.status_code == 503:
                stop.wait(0.05)  # a client backing off, as Retry-After asks (shortened for the test)


@contextmanager
def scheduling(
    base: str, token: str, answers: Answers, *, queue: str = "jobs", clients: int = 4, groups: int = 0
) -> Iterator[Callable[[], None]]:
    """`clients` threads scheduling into `queue` without pause (into `groups` groups, when given)
    until the function yielded is called (or the block ends): it stops and joins them."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=_schedule_until, args=(stop, base, token, n, answers, queue, groups), daemon=True)
        for n in range(clients)
    ]
    for thread in threads:
        thread.start()

    def stop_them() -> None:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

    try:
        yield stop_them
    finally:
        stop_them()


def admin(store: Store) -> str:
    """Queues with short leases (a claim whose answer the failover lost is redelivered once its
    lease is over) and an admin token."""
    store.queues.put("jobs", QueueSettings(lease_seconds=2), Settings())
    store.queues.put("pulls", QueueSettings(lease_seconds=1), Settings())
    return store.tokens.create("failover-test", is_admin=True)


def fail_over(pair: Pair, answers: Answers) -> tuple[float, float]:
    """kill -9 of the primary; once writes are refused (503: the standby is up, but read-only),
    promotion of the standby. Returns the monotonic times of the kill and of the promotion."""
    pair.primary.kill()
    killed = time.monotonic()
    wait_until(
        lambda: answers.refused_after(killed) >= 5,
        what=lambda: f"503s while no primary: {answers.snapshot()[-3:]}",
    )
    pair.standby.promote()
    return killed, time.monotonic()


def check_answers(answers: Answers) -> set[str]:
    """Never a 500 nor a dropped connection, every 503 with Retry-After; the keys answered 2xx."""
    seen = answers.snapshot()
    statuses = {status for _, status, _, _ in seen}
    assert statuses <= {202, 503}, statuses
    assert all(retry for _, status, retry, _ in seen if status == 503)
    return {key for key, status, _, _ in seen if status == 202}


def check_delivered(url: str, queue: str, accepted: set[str], delivered: Delivered) -> dict[str, list[int]]:
    """Every event of `accepted` is kept and delivered; one delivered twice says so (its
    redeliver_count, in the delivery and in the store). Returns the keys delivered twice."""
    wait_until(
        lambda: accepted <= delivered.keys(),
        timeout=30,
        what=lambda: f"{len(accepted - delivered.keys())} accepted events not delivered",
    )
    by_key: dict[str, list[int]] = {}
    for key, redeliveries, _ in delivered.snapshot():
        by_key.setdefault(key, []).append(redeliveries)
    duplicates = {key: counts for key, counts in by_key.items() if len(counts) > 1}
    store = Store(create_engine(url, pool_size=1))
    try:
        missing = [key for key in sorted(accepted) if not _kept(store, queue, key)]
        for key, counts in duplicates.items():
            assert max(counts) >= 1, (key, counts)
            assert store.events.get(queue, key).redeliver_count >= 1
    finally:
        store.engine.dispose()
    assert missing == []
    return duplicates


def _kept(store: Store, queue: str, key: str) -> bool:
    try:
        store.events.get(queue, key)
    except NotFound:
        return False
    return True


def report(name: str, measured: dict[str, Any]) -> None:
    """Print what was measured (pytest -s shows it), for docs/deploy.md."""
    print(f"\n{name}: {json.dumps(measured)}")


def cpus() -> int:
    return os.cpu_count() or 0
