"""The transactional outbox against a real tickler server and a real PostgreSQL standing for the
service's own database: calls written in the service's transaction reach tickler only when it
commits, once, in order per key — with several relays, and relays killed with SIGKILL mid-batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from tickler_client import Client, NotFound, TicklerError, ValidationError, outbox
from tickler_client.outbox import Relay, Row

from tests import pg
from tests.helpers_wait import wait_until
from tickler.scheduler.db import libpq_url

QUEUE = "emails"


@pytest.fixture(scope="session")
def _service_database(admin_url: str) -> Iterator[str]:
    url = pg.create_database(admin_url, prefix="service")
    yield libpq_url(url)
    pg.drop_database(admin_url, url)


@pytest.fixture
def service_url(_service_database: str) -> str:
    """The service's database (libpq URL): a table of its own and a fresh outbox."""
    with psycopg.connect(_service_database, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS tickler_outbox, tickler_outbox_sent, account")
        conn.execute("CREATE TABLE account (id int PRIMARY KEY, email text NOT NULL)")
        with conn.transaction():
            outbox.install(conn)
    return _service_database


@pytest.fixture
def service(service_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The service's connection (autocommit: each `with service.transaction()` is one)."""
    with psycopg.connect(service_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def reader(live_server: str, admin_token: str, token: str) -> Iterator[Client]:
    """A client of the service, with the pull queue `emails` created (nothing consumes it)."""
    with Client(live_server, admin_token) as admin:
        admin.put_queue(QUEUE, delivery="pull")
    with Client(live_server, token, timeout=10, retry_backoff=0.01) as client:
        yield client


@pytest.fixture
def relay(service_url: str, reader: Client) -> Iterator[Relay]:
    with Relay(service_url, reader, batch_size=50) as relay:
        yield relay


def count(url: str, table: str = "tickler_outbox") -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # a fixed table name
    return int(row[0]) if row else 0


def actions(client: Client, item_key: str) -> list[str]:
    """The key's timeline in tickler ([] for a key never seen)."""
    try:
        return client.timeline(QUEUE, item_key).actions
    except NotFound:
        return []


def drain(relay: Relay) -> None:
    """Rounds until the outbox is empty."""
    wait_until(lambda: relay.run_once() == 0, what="the outbox to empty")


def test_install_again_changes_nothing_from_each_entry_point(service_url: str) -> None:
    with psycopg.connect(service_url) as conn:
        conn.execute("INSERT INTO tickler_outbox (queue, item_key, operation) VALUES ('q', 'k', 'cancel')")
        outbox.install(conn)
    engine = sa.create_engine(service_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            outbox.install(conn)
    finally:
        engine.dispose()
    command = [sys.executable, "-m", "tickler_client.outbox.cli", "install", "--database-url", service_url]
    assert "tables ready" in subprocess.run(command, check=True, capture_output=True, text=True).stdout
    assert count(service_url) == 1  # the row written before is still there
    assert "CREATE TABLE IF NOT EXISTS tickler_outbox" in outbox.SCHEMA_SQL


def test_a_rolled_back_transaction_schedules_nothing(
    service: psycopg.Connection[Any], relay: Relay, reader: Client, service_url: str
) -> None:
    with pytest.raises(RuntimeError), service.transaction():
        service.execute("INSERT INTO account VALUES (1, 'ana@example.com')")
        outbox.schedule(service, QUEUE, "welcome:ana", {"template": "welcome"}, delay=3600)
        raise RuntimeError("the signup failed after scheduling")
    with service.transaction():
        service.execute("INSERT INTO account VALUES (2, 'bo@example.com')")
        outbox.schedule(service, QUEUE, "welcome:bo", {"template": "welcome"}, delay=3600)
    drain(relay)
    assert actions(reader, "welcome:ana") == []
    assert actions(reader, "welcome:bo") == ["enqueued"]
    assert count(service_url) == 0 and count(service_url, "tickler_outbox_sent") == 0
    assert (relay.stats.forwarded, relay.stats.refused, relay.stats.unanswered) == (1, 0, 0)


def test_calls_arrive_once_in_order_from_a_sqlalchemy_transaction(
    service_url: str, relay: Relay, reader: Client
) -> None:
    engine = sa.create_engine(service_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            written_at = conn.execute(sa.text("SELECT now()")).scalar_one()
            outbox.schedule(conn, QUEUE, "trial:1", {"n": 1}, delay=timedelta(days=1), group_key="acct-1")
            outbox.reschedule(conn, QUEUE, "trial:1", delay=timedelta(days=2), data={"n": 2})
            outbox.schedule(conn, QUEUE, "trial:2", {"n": 1}, schedule_on=datetime(2031, 1, 1, tzinfo=UTC))
            outbox.cancel(conn, QUEUE, "trial:2", reason="upgraded")
            outbox.schedule(conn, QUEUE, "now", {})
    finally:
        engine.dispose()
    drain(relay)
    assert actions(reader, "trial:1") == ["enqueued", "rescheduled"]
    event = reader.get(QUEUE, "trial:1")
    # the delay counts from the database clock when the row was written, not from its sending
    assert event.schedule_on - written_at < timedelta(days=2, seconds=5)
    assert event.schedule_on - written_at >= timedelta(days=2)
    assert (event.data, event.group_key) == ({"n": 2}, "acct-1")
    assert actions(reader, "trial:2") == ["enqueued", "cancelled"]
    assert reader.get(QUEUE, "now").schedule_on - written_at < timedelta(seconds=5)


def test_mistakes_are_refused_before_anything_is_written(service: psycopg.Connection[Any], service_url: str) -> None:
    with pytest.raises(ValidationError, match="timezone") as caught:
        outbox.schedule(service, QUEUE, "k", schedule_on=datetime(2030, 1, 1, 9))  # naive
    assert isinstance(caught.value, TicklerError) and list(caught.value.errors) == ["schedule_on"]
    with pytest.raises(ValidationError):
        outbox.schedule(service, QUEUE, "k", schedule_on=datetime(2030, 1, 1, tzinfo=UTC), delay=5)
    with pytest.raises(ValidationError):
        outbox.schedule(service, QUEUE, "k", {"x": float("nan")})
    with pytest.raises(ValidationError):
        outbox.schedule(service, QUEUE, "k", on_conflict="overwrite")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        outbox.reschedule(service, QUEUE, "k")  # nothing to change
    assert count(service_url) == 0


def test_refusals_are_answers_deleted_and_reported(
    service: psycopg.Connection[Any], service_url: str, reader: Client
) -> None:
    refused: list[tuple[Row, TicklerError]] = []
    reader.schedule(QUEUE, "taken", delay=3600)
    with service.transaction():
        outbox.schedule(service, QUEUE, "taken", {"n": 2})  # on_conflict="reject": 409
        outbox.reschedule(service, QUEUE, "never-scheduled", delay=60)  # 404
        outbox.schedule(service, QUEUE, "fine", {})
    with Relay(service_url, reader, on_refused=lambda row, error: refused.append((row, error))) as relay:
        drain(relay)
        assert (relay.stats.forwarded, relay.stats.refused) == (3, 2)
    assert sorted((row.item_key, error.status) for row, error in refused) == [("never-scheduled", 404), ("taken", 409)]
    assert actions(reader, "taken") == ["enqueued"] and actions(reader, "fine") == ["enqueued"]
    assert count(service_url) == 0


def test_rows_stay_while_tickler_does_not_answer(
    service: psycopg.Connection[Any], service_url: str, reader: Client
) -> None:
    with service.transaction():
        outbox.schedule(service, QUEUE, "a", {}, delay=60)
        outbox.cancel(service, QUEUE, "a")
    with Client("http://127.0.0.1:9", "t", retries=0) as nowhere, Relay(service_url, nowhere) as down:
        assert down.run_once() == 1  # the cancel waits behind its schedule
        assert (down.stats.forwarded, down.stats.unanswered) == (0, 1)
    with psycopg.connect(service_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT operation, tries, last_error IS NOT NULL FROM tickler_outbox ORDER BY id"
        ).fetchall()
    assert rows == [("schedule", 1, True), ("cancel", 0, False)]
    with Relay(service_url, reader) as relay:
        drain(relay)
    assert actions(reader, "a") == ["enqueued", "cancelled"]


def test_a_cancel_waits_while_its_event_is_in_flight(
    service: psycopg.Connection[Any], service_url: str, reader: Client, relay: Relay
) -> None:
    reader.schedule(QUEUE, "k")
    [lease] = reader.claim(QUEUE, worker="w")
    with service.transaction():
        outbox.cancel(service, QUEUE, "k")
        outbox.schedule(service, QUEUE, "k", {"second": True}, delay=60, on_conflict="replace")
    assert relay.run_once() == 1  # the cancel: 409 in flight, it stays; the schedule waits behind it
    assert (relay.stats.forwarded, relay.stats.unanswered, count(service_url)) == (0, 1, 2)
    reader.nack(lease, "smtp down", retry_in_seconds=3600)  # the delivery failed: the event is open again
    drain(relay)
    assert actions(reader, "k") == ["enqueued", "claimed", "failed", "cancelled", "enqueued"]
    assert reader.get(QUEUE, "k").data == {"second": True}


def test_a_row_sent_before_its_relay_died_takes_effect_once(
    service: psycopg.Connection[Any], service_url: str, reader: Client, relay: Relay
) -> None:
    with service.transaction():
        outbox.schedule(service, QUEUE, "moved", {"n": 1}, delay=60)
        outbox.schedule(service, QUEUE, "dropped", {}, delay=60)
    drain(relay)
    with service.transaction():
        outbox.schedule(service, QUEUE, "due", {"n": 1})  # due now: delivered before the resend
        outbox.reschedule(service, QUEUE, "moved", delay=3600)
        outbox.cancel(service, QUEUE, "dropped")
    # A relay marks its batch sent, sends it, and dies before deleting: its transaction is gone.
    with psycopg.connect(service_url, autocommit=True) as conn:
        picked = conn.execute("SELECT id, queue, item_key, operation, body FROM tickler_outbox ORDER BY id").fetchall()
        conn.execute("INSERT INTO tickler_outbox_sent (id) SELECT id FROM tickler_outbox")
    outcome = relay.forwarder.forward(Row(*r) for r in picked)
    assert len(outcome.done) == 3
    [lease] = reader.claim(QUEUE, worker="w")
    reader.ack(lease)
    assert count(service_url) == 3  # all still there, all marked: a restarted relay finds them
    drain(relay)
    assert actions(reader, "due") == ["enqueued", "claimed", "delivered"]  # not scheduled a second time
    assert actions(reader, "moved") == ["enqueued", "rescheduled"]  # not moved a second time
    assert actions(reader, "dropped") == ["enqueued", "cancelled"]
    assert count(service_url) == 0 and count(service_url, "tickler_outbox_sent") == 0


def test_writers_of_one_key_commit_in_turn(
    service: psycopg.Connection[Any], service_url: str, relay: Relay, reader: Client
) -> None:
    """Per key, ids are in commit order: a second writer of the key waits for the first's commit."""
    second_done = threading.Event()

    def second_writer() -> None:
        with psycopg.connect(service_url) as conn:  # one transaction
            outbox.cancel(conn, QUEUE, "k")
        second_done.set()

    with service.transaction():
        outbox.schedule(service, QUEUE, "k", delay=60)
        writer = threading.Thread(target=second_writer)
        writer.start()
        wait_until(lambda: waiting_on_a_lock(service_url), what="the second writer waiting for the key")
        assert not second_done.is_set()
    writer.join(timeout=10)
    assert second_done.is_set()
    drain(relay)
    assert actions(reader, "k") == ["enqueued", "cancelled"]


def waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()
    return bool(row and row[0])


EXPECTED = {
    "schedule": ["enqueued"],
    "reschedule": ["enqueued", "rescheduled"],
    "cancel": ["enqueued", "rescheduled", "cancelled"],
}


def write_calls(conn: Any, item_key: str, calls: int, delay: float) -> None:
    outbox.schedule(conn, QUEUE, item_key, {"key": item_key}, delay=delay)
    if calls > 1:
        outbox.reschedule(conn, QUEUE, item_key, delay=delay * 2)
    if calls > 2:
        outbox.cancel(conn, QUEUE, item_key)


@pytest.mark.slow
def test_per_key_order_with_concurrent_writers_and_two_relays(
    service_url: str, reader: Client, live_server: str, token: str
) -> None:
    """Four writers commit schedule, reschedule and cancel of their keys as three transactions
    each, while two relays forward: every key ends with the three calls, in order, once."""
    keys = {f"w{w}:k{i}": w for w in range(4) for i in range(25)}
    stop = threading.Event()

    def run_relay() -> None:
        with (
            Client(live_server, token, timeout=10) as client,
            Relay(service_url, client, batch_size=7, poll_seconds=0.02) as relay,
        ):
            relay.run(stop, handle_signals=False)

    def writer(w: int) -> None:
        mine = [key for key, owner in keys.items() if owner == w]
        with psycopg.connect(service_url, autocommit=True) as conn:
            for key in mine:
                with conn.transaction():
                    outbox.schedule(conn, QUEUE, key, {"key": key}, delay=3600)
            for key in mine:
                with conn.transaction():
                    outbox.reschedule(conn, QUEUE, key, delay=7200)
            for key in mine:
                with conn.transaction():
                    outbox.cancel(conn, QUEUE, key)

    relays = [threading.Thread(target=run_relay) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for thread in relays + writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=60)
    wait_until(lambda: count(service_url) == 0, timeout=60, what=lambda: f"{count(service_url)} rows left")
    stop.set()
    for thread in relays:
        thread.join(timeout=30)
    wrong = {key: got for key in keys if (got := actions(reader, key)) != EXPECTED["cancel"]}
    assert wrong == {}


def start_relay(service_url: str, live_server: str, token: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "tickler_client.outbox.cli",
        "relay",
        "--batch-size",
        "10",
        "--poll-seconds",
        "0.05",
    ]
    env = {
        **os.environ,
        "TICKLER_OUTBOX_DATABASE_URL": service_url,
        "TICKLER_URL": live_server,
        "TICKLER_TOKEN": token,
    }
    return subprocess.Popen([*command, "--log-level", "WARNING"], env=env, stderr=subprocess.DEVNULL)


def connected_relays(url: str) -> set[int]:
    """The process ids of the relays connected to the service's database."""
    with psycopg.connect(url, autocommit=True) as conn:
        names = conn.execute("SELECT application_name FROM pg_stat_activity").fetchall()
    return {int(name.rsplit(" ", 1)[1]) for (name,) in names if name.startswith("tickler-outbox relay ")}


def marked(url: str) -> set[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {int(r[0]) for r in conn.execute("SELECT id FROM tickler_outbox_sent").fetchall()}


@pytest.mark.slow
def test_relays_killed_mid_batch_lose_and_repeat_nothing(
    service: psycopg.Connection[Any], service_url: str, reader: Client, live_server: str, token: str
) -> None:
    """Two relay processes forward 300 calls; one of them is killed with SIGKILL while it has a
    batch in flight (rows marked sent, not yet deleted), again and again, and restarted. In the
    end tickler holds exactly what the calls, each made once, would have made."""
    plan = {f"k{i:03}": 1 + i % 3 for i in range(150)}
    with service.transaction():
        for key, calls in plan.items():
            write_calls(service, key, calls, delay=3600)
    relays = [start_relay(service_url, live_server, token) for _ in range(2)]
    kills, seen = 0, marked(service_url)

    def new_batch_or_done() -> set[int] | bool:
        return (marked(service_url) - seen) or count(service_url) == 0

    try:
        while kills < 6:
            if wait_until(new_batch_or_done, what="a batch in flight") is True:
                break  # all forwarded before the next kill
            victim = kills % 2
            relays[victim].send_signal(signal.SIGKILL)
            relays[victim].wait(timeout=10)
            seen |= marked(service_url)
            kills += 1
            relays[victim] = start_relay(service_url, live_server, token)
        wait_until(lambda: count(service_url) == 0, timeout=90, what=lambda: f"{count(service_url)} rows left")
        # Both relays past their start (signal handlers in place) before they are told to stop.
        wait_until(lambda: connected_relays(service_url) >= {p.pid for p in relays}, what="both relays connected")
    finally:
        for process in relays:
            process.send_signal(signal.SIGTERM)
        for process in relays:
            assert process.wait(timeout=30) == 0
    assert kills >= 3, f"only {kills} kills landed mid-batch"
    assert count(service_url, "tickler_outbox_sent") == 0
    names = list(EXPECTED)
    wrong = {key: got for key, calls in plan.items() if (got := actions(reader, key)) != EXPECTED[names[calls - 1]]}
    assert wrong == {}
