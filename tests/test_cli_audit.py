"""`tickler audit` (the operations log for people and, with --json, for scripts), the
upcoming-load line of `tickler queues show`, and `tickler events list` and `queues list` on a read
replica, run in-process against the test database."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest

from tests import pg
from tickler.cli import main
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, database_url: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    monkeypatch.setenv("TICKLER_DATABASE_URL", database_url)
    monkeypatch.setenv("TICKLER_MIGRATE_ON_START", "false")

    def run(*args: str, code: int = 0) -> str:
        assert main(list(args)) == code
        return capsys.readouterr().out

    return run


def test_audit_lists_changes_newest_first_for_people_and_scripts(cli: Callable[..., str], store: Store) -> None:
    cli("queues", "pause", "jobs", code=1)  # no such queue: nothing changed, nothing logged
    store.queues.put("jobs", QueueSettings(), Settings(), actor="ops")
    cli("queues", "pause", "jobs")
    entries = json.loads(cli("audit", "--json"))["entries"]
    assert [(e["action"], e["queue"]) for e in entries] == [("queue.paused", "jobs"), ("queue.created", "jobs")]
    assert entries[0]["actor"].startswith("cli:")
    assert entries[0]["before"] == {"paused": False} and entries[0]["after"] == {"paused": True}
    table = cli("audit", "--queue", "jobs", "--action", "queue.paused").splitlines()
    assert table[0].split() == ["AT", "ACTOR", "ACTION", "QUEUE", "CHANGES"]
    assert len(table) == 2 and "paused: False -> True" in table[1]
    assert json.loads(cli("audit", "--json", "--actor", "nobody")) == {"entries": []}
    cli("audit", "--action", "queue.exploded", code=2)


def test_queues_show_has_the_upcoming_load(
    cli: Callable[..., str], store: Store, make_queue: Callable[..., Queue]
) -> None:
    queue = make_queue("jobs")
    now = datetime.now(UTC)
    events = [
        NewEvent(item_key=f"k{i}", data={}, schedule_on=now + timedelta(hours=h)) for i, h in enumerate([2, 3, 30])
    ]
    store.events.schedule_batch(queue, events, actor="t")
    [line] = [line for line in cli("queues", "show", "jobs").splitlines() if line.startswith("next 24 h")]
    assert "2 pending falling due" in line and "1 later" in line


@contextmanager
def stand_in_replica(admin_url: str, keys: list[str]) -> Iterator[str]:
    """A second migrated database standing in for a replica 0 s behind (by its own measure: it is
    no standby), its queue "emails" holding other events than the primary's: where a read went
    shows in what it found."""
    replica_url = pg.create_database(admin_url, prefix="tickler_cli_replica")
    try:
        migrate(replica_url)
        engine = create_engine(replica_url, pool_size=1)
        try:
            replica = Store(engine)
            queue = replica.queues.put("emails", QueueSettings(), Settings()).queue
            replica.events.schedule_batch(queue, [NewEvent(key, {}) for key in keys], actor="test")
        finally:
            engine.dispose()
        yield replica_url
    finally:
        pg.drop_database(admin_url, replica_url)


@pytest.fixture
def on_the_primary(store: Store, make_queue: Callable[..., Queue]) -> None:
    """The queue "emails" on the primary, holding one event: "on-the-primary"."""
    queue = make_queue("emails")
    store.events.schedule_batch(queue, [NewEvent("on-the-primary", {})], actor="test")


@pytest.mark.usefixtures("on_the_primary")
def test_events_list_reads_the_replica_when_one_is_set(
    cli: Callable[..., str], monkeypatch: pytest.MonkeyPatch, admin_url: str
) -> None:
    """TICKLER_READ_DATABASE_URL serves the command line's reads that may lag, as the API's."""
    with stand_in_replica(admin_url, ["on-the-replica"]) as replica_url:
        monkeypatch.setenv("TICKLER_READ_DATABASE_URL", replica_url)
        listed = json.loads(cli("events", "list", "emails", "--json"))
        assert [event["item_key"] for event in listed["events"]] == ["on-the-replica"]
        monkeypatch.delenv("TICKLER_READ_DATABASE_URL")
        listed = json.loads(cli("events", "list", "emails", "--json"))
        assert [event["item_key"] for event in listed["events"]] == ["on-the-primary"]


@pytest.mark.usefixtures("on_the_primary")
def test_queues_list_counts_on_the_replica_when_one_is_set(
    cli: Callable[..., str], monkeypatch: pytest.MonkeyPatch, admin_url: str
) -> None:
    """`queues list` (the table, over one plain connection, and --json) counts on the replica
    while it is reachable and close enough; on the primary when it is not, or when there is none."""

    def pending() -> tuple[int, int]:
        [row] = [line.split() for line in cli("queues", "list").splitlines()[1:]]
        [listed] = json.loads(cli("queues", "list", "--json"))["queues"]
        return int(row[3]), listed["counts"]["pending"]

    with stand_in_replica(admin_url, ["r1", "r2", "r3"]) as replica_url:
        monkeypatch.setenv("TICKLER_READ_DATABASE_URL", replica_url)
        assert pending() == (3, 3)
        # a replica that cannot be reached (nothing listens there): the primary's counts
        monkeypatch.setenv("TICKLER_READ_DATABASE_URL", f"postgresql://postgres@127.0.0.1:{_closed_port()}/tickler")
        assert pending() == (1, 1)
        monkeypatch.delenv("TICKLER_READ_DATABASE_URL")
        assert pending() == (1, 1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
