"""Starting against a database that is not there yet, or not answering: a server that accepts TCP
and never says a word (a real listener that never writes) stops each command within
TICKLER_CONNECT_TIMEOUT, in one line, exit 2; an unmigrated database is one short line saying what
to run. And `tickler queues create` takes the HTTP API's settings, with its per-field messages."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pg

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never writes a byte (as a firewall's tarpit, or a
    service that is not PostgreSQL, does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


def _run(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    env |= {"TICKLER_DATA_DIR": "/nonexistent/tickler", "TICKLER_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tickler.cli", *args], env=env | variables, capture_output=True, text=True, timeout=60
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    said = [line for line in result.stderr.splitlines() if not line.startswith(("{", "tickler migrate: database"))]
    assert len(said) == 1 and said[0].startswith("tickler: "), result.stderr
    return said[0]


@pytest.mark.parametrize(
    "args", [("migrate",), ("queues", "list"), ("queues", "show", "emails"), ("worker",)], ids=" ".join
)
def test_a_server_that_never_answers_stops_the_command_at_the_connect_timeout(
    silent_port: int, args: tuple[str, ...]
) -> None:
    started = time.monotonic()
    result = _run(
        *args, TICKLER_DATABASE_URL=f"postgresql://tickler@127.0.0.1:{silent_port}/tickler", TICKLER_CONNECT_TIMEOUT="2"
    )
    took = time.monotonic() - started
    line = _one_line(result)
    assert f"127.0.0.1:{silent_port}/tickler" in line and "no answer within 2 s" in line, line
    assert "TICKLER_CONNECT_TIMEOUT" in line, line
    assert took < 20, took  # the timeout (2 s), not for ever; start-up of the interpreter besides


def test_a_negative_connect_timeout_is_refused() -> None:
    line = _one_line(_run("queues", "list", TICKLER_CONNECT_TIMEOUT="-1"))
    assert "TICKLER_CONNECT_TIMEOUT" in line


def test_an_unmigrated_database_is_one_short_line_saying_what_to_run(admin_url: str) -> None:
    url = pg.create_database(admin_url, prefix="tickler_unmigrated")
    try:
        for args in (("queues", "list"), ("queues", "list", "--json"), ("events", "list", "emails")):
            line = _one_line(_run(*args, TICKLER_DATABASE_URL=url))
            assert "not migrated" in line and "run `tickler migrate`" in line, line
            assert len(line) < 160, line
        worker = _one_line(_run("worker", TICKLER_DATABASE_URL=url, TICKLER_MIGRATE_ON_START="false"))
        assert "not migrated" in worker and "run `tickler migrate`" in worker and len(worker) < 160, worker
    finally:
        pg.drop_database(admin_url, url)


def test_queues_create_takes_the_apis_settings_and_refuses_what_it_refuses(database_url: str) -> None:
    created = _run(
        "queues", "create", "hooks", "--url", "http://127.0.0.1:9/in", "--max-attempts", "3",
        "--settings", '{"backoff": {"multiplier": 3}, "lease_seconds": 5}', "--json",
        TICKLER_DATABASE_URL=database_url,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    body = json.loads(created.stdout)
    assert body["delivery"] == {"mode": "webhook", "url": "http://127.0.0.1:9/in", "timeout_seconds": 10.0}
    assert (body["max_attempts"], body["lease_seconds"], body["backoff"]["multiplier"]) == (3, 5.0, 3.0)
    assert body["signing_secret"].startswith("whsec_")  # shown once, as the API shows it

    plain = _run("queues", "create", "emails", TICKLER_DATABASE_URL=database_url)
    assert plain.returncode == 0 and "delivery      pull" in plain.stdout, plain
    again = _run("queues", "create", "emails", TICKLER_DATABASE_URL=database_url)
    assert again.returncode == 1 and "exists already" in again.stderr, again

    bad = _run("queues", "create", "bad", "--mode", "webhook", "--max-attempts", "0", TICKLER_DATABASE_URL=database_url)
    assert bad.returncode == 2, bad
    assert "  delivery.url: A webhook queue needs a url." in bad.stderr.splitlines(), bad.stderr
    assert any(line.startswith("  max_attempts: ") for line in bad.stderr.splitlines()), bad.stderr
    listed = _run("queues", "list", "--json", TICKLER_DATABASE_URL=database_url)
    assert sorted(q["name"] for q in json.loads(listed.stdout)["queues"]) == ["emails", "hooks"]  # nothing half-made


# An install without the embedded PostgreSQL (the image removes it): pgserver cannot be imported.
WITHOUT_PGSERVER = "import sys; sys.modules['pgserver'] = None; from tickler.cli import main; sys.exit(main())"


def test_serve_without_a_url_nor_the_embedded_database_says_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PGSERVER, "serve", "--port", "0", "--web-processes", "1"],
        env=env | {"TICKLER_DATA_DIR": str(tmp_path / "data"), "TICKLER_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = _one_line(result)
    assert "TICKLER_DATABASE_URL" in line and "embedded" in line and "pip install pgserver" in line, line


def test_the_engine_and_the_listen_connection_give_up_at_the_connect_timeout(silent_port: int) -> None:
    """In-process, the two kinds of connection the commands above do not reach first: the store's
    pool (and so its driver connections), and the LISTEN connection's thread, which retries."""
    import psycopg
    import sqlalchemy as sa

    from tickler.scheduler.db import create_engine
    from tickler.scheduler.wakeup import WakeupListener

    url = f"postgresql://tickler@127.0.0.1:{silent_port}/tickler"
    engine = create_engine(url, pool_size=1, connect_timeout=2)
    started = time.monotonic()
    with pytest.raises(sa.exc.OperationalError) as caught:
        engine.connect()
    assert isinstance(caught.value.orig, psycopg.errors.ConnectionTimeout)
    assert time.monotonic() - started < 10
    engine.dispose()

    listener = WakeupListener(url, connect_timeout=2, reconnect_delay=0.1).start()
    thread = listener._thread
    assert thread is not None
    listener.stop()  # joins for 5 s: a connect that never gave up would outlive it
    thread.join(timeout=10)
    assert not thread.is_alive() and not listener.connected.is_set()
