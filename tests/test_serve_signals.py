"""How `tickler serve` ends, with real processes: closing the terminal (SIGHUP) stops serve and its
embedded PostgreSQL as SIGTERM does; a serve killed without cleaning up leaves the embedded server
running, and the next serve then still stops it on its way out; a terminal's Ctrl-C with several web
processes is a clean stop every time, with no error logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers_http import QuietHandler, serving
from tests.helpers_wait import wait_until
from tests.test_cli_embedded import Serve as EmbeddedServe
from tests.test_cli_embedded import _alive, _free_port, data_dir
from tests.test_serve_processes import Serve, _descendants, fresh_database
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import QueueSettings, Store

__all__ = ["data_dir", "fresh_database"]  # fixtures, used by name


def _exit_code(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The process's exit code, or None when it is still running after `timeout` seconds (so that
    the assertion shows serve's output: where its stop was when the time ran out)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture
def sighup_as_from_a_terminal() -> Iterator[None]:
    """serve keeps an ignored SIGHUP ignored (what `nohup` asks), and a process inherits its
    parent's: under a suite run with nohup, a serve started here would never hear the hang-up.
    Its children get SIGHUP's default, as a program started from a terminal has it."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])


def _holders(data_dir: Path) -> list[int]:
    """pgserver's list of the processes that hold the embedded server."""
    path = data_dir / "pgdata" / ".handle_pids.json"
    found: list[int] = json.loads(path.read_text()) if path.exists() else []
    return found


@pytest.mark.own_server
@pytest.mark.usefixtures("sighup_as_from_a_terminal")
def test_sighup_stops_serve_and_its_embedded_postgresql(data_dir: Path) -> None:
    serve = EmbeddedServe(data_dir, _free_port())
    try:
        serve.wait_ready()
        postmaster = _postmaster_pid(data_dir)
        assert _alive(postmaster)
        serve.process.send_signal(signal.SIGHUP)  # what closing the terminal sends
        assert _exit_code(serve.process, 60) == 0, serve.output()
    finally:
        serve.stop()
    wait_until(lambda: not _alive(postmaster), timeout=30, what="the embedded PostgreSQL outlived serve")
    assert "Traceback" not in serve.output()


@pytest.mark.own_server
def test_a_serve_killed_without_cleanup_does_not_keep_the_next_from_stopping_postgresql(data_dir: Path) -> None:
    killed = EmbeddedServe(data_dir, _free_port())
    try:
        killed.wait_ready()
        killed.process.kill()  # no atexit: its pid stays on pgserver's list, the server runs on
        killed.process.wait(timeout=30)
    finally:
        killed.stop()
    postmaster = _postmaster_pid(data_dir)
    assert _alive(postmaster) and killed.process.pid in _holders(data_dir)

    serve = EmbeddedServe(data_dir, _free_port())
    try:
        serve.wait_ready()
        assert _postmaster_pid(data_dir) == postmaster  # it joined the server left running
        assert killed.process.pid not in _holders(data_dir)  # a process that is gone holds nothing
        serve.process.send_signal(signal.SIGTERM)
        assert _exit_code(serve.process, 60) == 0, serve.output()
    finally:
        serve.stop()
    wait_until(lambda: not _alive(postmaster), timeout=30, what="the embedded PostgreSQL outlived the last serve")


def _errors_logged(serve: Serve) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in serve.log_path.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("level") in ("error", "critical")]


@contextmanager
def held_receiver() -> Iterator[tuple[str, threading.Semaphore]]:
    """A webhook receiver that holds every request until the test ends: a delivery in progress
    keeps serve's dispatcher stopping for its grace, the moment the race showed. Yields its URL and
    a semaphore released once per request that arrived."""
    arrived, done = threading.Semaphore(0), threading.Event()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.release()
            done.wait(60)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as base:
        try:
            yield f"{base}/hooks", arrived
        finally:
            done.set()


@pytest.mark.slow
def test_ctrl_c_of_serve_with_web_processes_logs_no_error_time_after_time(fresh_database: str, tmp_path: Path) -> None:
    """Ctrl-C reaches serve, the supervisor and the web processes at once. While serve's dispatcher
    waits for a delivery in progress, the supervisor has long stopped: that must not be taken for a
    crash ("the web processes' supervisor exited"), nor a web process's stop for one to replace."""
    migrate(fresh_database)
    engine = create_engine(fresh_database, pool_size=1)
    store = Store(engine)
    with held_receiver() as (url, arrived):
        store.queues.put("hooks", QueueSettings(delivery_mode="webhook", webhook_url=url), Settings())
        try:
            for attempt in range(3):
                serve = Serve(
                    tmp_path, fresh_database, _free_port(), "--web-processes", "2", own_group=True,
                    TICKLER_WORKER_SHUTDOWN_GRACE="3",
                )  # fmt: skip
                try:
                    serve.wait_serving()
                    family = wait_until(
                        lambda s=serve: len(_descendants(s.process.pid)) == 2 and _descendants(s.process.pid)
                    )
                    store.events.schedule(store.queues.get("hooks"), NewEvent(f"k{attempt}", {}), actor="test")
                    assert arrived.acquire(timeout=30), serve.output()  # a delivery in progress
                    os.killpg(serve.process.pid, signal.SIGINT)
                    assert _exit_code(serve.process, 60) == 0, serve.output()
                finally:
                    serve.stop()
                assert _errors_logged(serve) == [], serve.output()
                assert "Traceback" not in serve.output()
                wait_until(
                    lambda f=family: not any(_alive(pid) for pid in f), timeout=20, what="a process outlived serve"
                )
        finally:
            engine.dispose()


@pytest.mark.usefixtures("sighup_as_from_a_terminal")
def test_sighup_of_serve_with_web_processes_stops_them_all(fresh_database: str, tmp_path: Path) -> None:
    serve = Serve(tmp_path, fresh_database, _free_port(), "--web-processes", "2", own_group=True)
    try:
        serve.wait_serving()
        family = wait_until(lambda: len(_descendants(serve.process.pid)) == 2 and _descendants(serve.process.pid))
        os.killpg(serve.process.pid, signal.SIGHUP)  # the terminal closed: the whole group hears it
        assert _exit_code(serve.process, 60) == 0, serve.output()
    finally:
        serve.stop()
    assert _errors_logged(serve) == [], serve.output()
    wait_until(lambda: not any(_alive(pid) for pid in family), timeout=20, what="a process outlived serve")
