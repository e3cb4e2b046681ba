"""`tickler serve --web-processes 2`: real processes on the tests' PostgreSQL. A kill -9 of serve
takes its web processes with it (the port is free for the next serve), a web process that dies is
replaced, /metrics adds up every process, a revoked token is refused by every process, and SIGTERM
stops them all with exit 0."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import pg
from tests.helpers import kill_if_running
from tests.helpers_wait import wait_until
from tests.receiver_async import HoldingReceiver, holding_receiver
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import QueueSettings, Store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh_database(admin_url: str) -> Iterator[str]:
    with pg.own_database(admin_url, "tickler_serve") as url:
        yield url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_free(port: int) -> bool:
    """Whether serve could bind the port now (as commands/serve.py binds: SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _get(port: int, path: str, token: str = "") -> tuple[int, bytes]:
    """One request on a connection of its own: the kernel may hand it to any of the processes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class Serve:
    def __init__(
        self, tmp_path: Path, database_url: str, port: int, *args: str, own_group: bool = False, **env: str
    ) -> None:
        self.port = port
        self.own_group = own_group
        self.log_path = tmp_path / f"serve-{port}-{len(list(tmp_path.iterdir()))}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("TICKLER_", "PROMETHEUS_"))}
        environ.update(
            TICKLER_DATABASE_URL=database_url,
            TICKLER_DATA_DIR=str(tmp_path / "unused"),
            TICKLER_LOG_FORMAT="json",
            PYTHONPATH=str(ROOT),
            **env,
        )
        self.env = environ
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tickler.cli", "serve", "--port", str(port), *args],
                cwd=ROOT,
                env=environ,
                stdout=log,
                stderr=log,
                start_new_session=own_group,  # a group of its own, as a terminal gives it
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def events(self, name: str) -> list[dict[str, object]]:
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == name]

    def wait_serving(self) -> None:
        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}: {self.output()}")
            return bool(self.events("serving"))

        wait_until(serving, timeout=60, interval=0.1, what=self.output)

    def web_processes(self) -> list[int]:
        """The processes besides serve's own that answer HTTP (the supervisor's children)."""
        return [pid for supervisor in _children(self.process.pid) for pid in _children(supervisor)]

    def tickler(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "tickler.cli", *args], env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return self.process.returncode


def test_kill_9_of_serve_takes_its_web_processes_along_and_a_new_serve_starts(
    fresh_database: str, tmp_path: Path
) -> None:
    port = _free_port()
    serve = Serve(tmp_path, fresh_database, port, "--web-processes", "2")
    try:
        serve.wait_serving()
        family = wait_until(lambda: len(_descendants(serve.process.pid)) == 2 and _descendants(serve.process.pid))
        assert len(serve.web_processes()) == 1
        serve.process.kill()
        serve.process.wait()
        wait_until(lambda: not any(_alive(pid) for pid in family), timeout=30, what="the web processes outlived serve")
        wait_until(lambda: _port_free(port), timeout=10, what=f"port {port} still held")
    finally:
        serve.stop()

    again = Serve(tmp_path, fresh_database, port, "--web-processes", "2")
    try:
        again.wait_serving()
        assert _get(port, "/healthz")[0] == 200
    finally:
        assert again.stop() == 0, again.output()
    assert not _descendants(again.process.pid)


def _requests_counted(scrape: bytes, route: str) -> float:
    pattern = rb'^tickler_http_requests_total\{[^}]*route="' + re.escape(route.encode()) + rb'"[^}]*\} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, scrape, re.MULTILINE))


def test_metrics_add_up_over_the_processes_and_a_dead_web_process_is_replaced(
    fresh_database: str, tmp_path: Path
) -> None:
    port = _free_port()
    serve = Serve(tmp_path, fresh_database, port, "--web-processes", "2")
    try:
        serve.wait_serving()
        (started,) = serve.events("web processes")
        metrics_dir = Path(str(started["metrics_dir"]))
        assert started["count"] == 2 and metrics_dir.is_dir()
        sent = 0

        def both_processes_answered() -> bool:
            nonlocal sent
            for _ in range(10):
                assert _get(port, "/healthz")[0] == 200
                sent += 1
            return len({path.name for path in metrics_dir.glob("counter_*.db")}) >= 2

        wait_until(both_processes_answered, timeout=60, what="every request went to one process")
        assert sent >= 10
        # One scrape, whichever process answers it, counts every process's requests.
        for _ in range(4):
            status, scrape = _get(port, "/metrics")
            assert status == 200
            assert _requests_counted(scrape, "/healthz") == sent

        (web,) = serve.web_processes()
        os.kill(web, signal.SIGKILL)
        replaced = wait_until(lambda: [pid for pid in serve.web_processes() if pid != web], timeout=30)
        assert len(replaced) == 1
        (restart,) = wait_until(lambda: serve.events("web process exited; starting another"), what=serve.output)
        assert restart["pid"] == web and restart["code"] == -signal.SIGKILL
        # The dead process's requests still count.
        assert _requests_counted(_get(port, "/metrics")[1], "/healthz") == sent
        family = _descendants(serve.process.pid)
    finally:
        code = serve.stop()
    assert code == 0, serve.output()
    assert not any(_alive(pid) for pid in family)
    assert not metrics_dir.exists()


def test_every_web_process_delivers_webhooks(fresh_database: str, tmp_path: Path) -> None:
    """Each process runs a dispatcher, so webhooks go out from every process's event loop. Three
    requests in flight per process and queue: six held at once must come from both."""
    port = _free_port()
    with holding_receiver() as receiver:
        serve = Serve(
            tmp_path, fresh_database, port, "--web-processes", "2", TICKLER_WORKER_WEBHOOK_QUEUE_CONCURRENCY="3"
        )
        engine = create_engine(fresh_database, pool_size=1)
        try:
            _six_held_webhooks(serve, engine, receiver)
            (web,) = serve.web_processes()
            assert {name.rpartition(":")[2] for name in _claimers(engine)} == {str(serve.process.pid), str(web)}
            receiver.answer_at_once()
            wait_until(lambda: sum(receiver.arrivals.values()) == 6 and _open_events(engine) == 0, timeout=60)
            assert set(receiver.arrivals.values()) == {1}  # each event once
        finally:
            engine.dispose()
            assert serve.stop() == 0, serve.output()


def test_sigterm_gives_back_the_leases_of_every_web_processs_deliveries(fresh_database: str, tmp_path: Path) -> None:
    """Requests held past the grace period: on SIGTERM each process's dispatcher gives its leases
    back (the events pending again at once, unclaimed) rather than being killed with them."""
    port = _free_port()
    with holding_receiver() as receiver:
        serve = Serve(
            tmp_path,
            fresh_database,
            port,
            "--web-processes",
            "2",
            TICKLER_WORKER_WEBHOOK_QUEUE_CONCURRENCY="3",
            TICKLER_WORKER_SHUTDOWN_GRACE="0.5",
        )
        engine = create_engine(fresh_database, pool_size=1)
        try:
            _six_held_webhooks(serve, engine, receiver)
            assert len(_claimers(engine)) == 2
            assert serve.stop() == 0, serve.output()
            with engine.connect() as conn:
                query = "SELECT lease_id, redeliver_count, schedule_on <= now() FROM tickler_event"
                rows = conn.execute(sa.text(query)).all()
            assert [tuple(row) for row in rows] == [(None, 0, True)] * 6, serve.output()
        finally:
            engine.dispose()
            serve.stop()


def _six_held_webhooks(serve: Serve, engine: sa.Engine, receiver: HoldingReceiver) -> None:
    """Once serve answers: a webhook queue to `receiver` and six events due now, until the
    receiver holds all six requests (held requests never time out and go again)."""
    serve.wait_serving()
    store = Store(engine)
    settings = QueueSettings(delivery_mode="webhook", webhook_url=receiver.url, webhook_timeout_seconds=60)
    queue = store.queues.put("hooks", settings, Settings()).queue
    for n in range(6):
        store.events.schedule(queue, NewEvent(item_key=f"k{n}", data={"n": n}), actor="test")
    wait_until(lambda: receiver.held == 6, timeout=60, what=lambda: f"held {receiver.held}: {serve.output()}")


def _claimers(engine: sa.Engine) -> set[str]:
    """The worker names (host:pid) that claimed the open events."""
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT DISTINCT claimed_by FROM tickler_event")).scalars())


def _open_events(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM tickler_event")).scalar_one())


def test_a_revoked_token_is_refused_by_every_web_process(fresh_database: str, tmp_path: Path) -> None:
    """The cache keeps a token for 300 s here: only the NOTIFY each process listens to can drop it."""
    port = _free_port()
    serve = Serve(tmp_path, fresh_database, port, "--web-processes", "2", TICKLER_CACHE_SECONDS="300")
    try:
        serve.wait_serving()
        token = serve.tickler("token", "create", "ops", "--admin").strip()
        for _ in range(20):  # on connections of their own: both processes cache the token
            assert _get(port, "/v1/queues", token)[0] == 200
        (listed,) = json.loads(serve.tickler("token", "list", "--json"))
        serve.tickler("token", "revoke", str(listed["id"]))
        wait_until(
            lambda: all(_get(port, "/v1/queues", token)[0] == 401 for _ in range(20)),
            timeout=10,
            what="a web process still takes the revoked token",
        )
    finally:
        assert serve.stop() == 0, serve.output()


def test_one_web_process_is_serve_as_before(fresh_database: str, tmp_path: Path) -> None:
    port = _free_port()
    serve = Serve(tmp_path, fresh_database, port, "--web-processes", "1")
    try:
        serve.wait_serving()
        assert _get(port, "/healthz")[0] == 200
        assert not _children(serve.process.pid)
        assert not serve.events("web processes")
    finally:
        assert serve.stop() == 0, serve.output()


def test_ctrl_c_stops_every_process_with_exit_0(fresh_database: str, tmp_path: Path) -> None:
    """A terminal's Ctrl-C signals the whole process group: serve, the supervisor, the web processes."""
    port = _free_port()
    serve = Serve(tmp_path, fresh_database, port, "--web-processes", "2", own_group=True)
    try:
        serve.wait_serving()
        family = wait_until(lambda: len(_descendants(serve.process.pid)) == 2 and _descendants(serve.process.pid))
        os.killpg(serve.process.pid, signal.SIGINT)
        assert serve.process.wait(timeout=30) == 0, serve.output()
    finally:
        serve.stop()
    assert "Traceback" not in serve.output()
    wait_until(lambda: not any(_alive(pid) for pid in family), timeout=10, what="a web process outlived serve")
    assert _port_free(port)


CRASHING = """
from tickler.commands import web_processes
from tickler.scheduler.logs import configure_logging

configure_logging("INFO", "json")
web_processes._Supervisor(1, lambda: 1).run()
"""


def test_a_stop_signal_that_lands_while_the_supervisor_logs_is_not_swallowed() -> None:
    """A logging handler takes any Exception raised while it writes (logging.Handler.handleError):
    the supervisor's stop, raised by its SIGTERM handler wherever the signal lands, must get
    through it (it lands right after a log line the sender waited for, as in the test below)."""
    import io
    import logging

    from tickler.commands import web_processes

    class SignalledWhileWriting(io.StringIO):
        def write(self, text: str) -> int:
            web_processes._raise_stop(signal.SIGTERM, None)
            return 0

    logger = logging.getLogger("tests.supervisor_stop")
    logger.propagate = False
    handler = logging.StreamHandler(SignalledWhileWriting())
    logger.addHandler(handler)
    try:
        with pytest.raises(web_processes._Stop):
            logger.error("web process exited; starting another")
    finally:
        logger.removeHandler(handler)


def test_a_web_process_that_keeps_dying_is_restarted_ever_more_slowly(tmp_path: Path) -> None:
    log_path = tmp_path / "supervisor.log"
    with log_path.open("wb") as log:
        supervisor = subprocess.Popen([sys.executable, "-c", CRASHING], cwd=ROOT, stdout=log, stderr=log)
    try:

        def restarts() -> list[dict[str, object]]:
            lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
            found = [line for line in lines if line["event"] == "web process exited; starting another"]
            return found if len(found) >= 4 else []

        found = wait_until(restarts, timeout=30, what=lambda: log_path.read_text())
        assert [line["restart_in_seconds"] for line in found[:4]] == [0.5, 1.0, 2.0, 4.0]
        assert all(line["code"] == 1 for line in found)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        kill_if_running(supervisor)


def test_without_fork_or_pdeathsig_serve_runs_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from tickler.commands import serve as serve_command
    from tickler.commands import web_processes
    from tickler.commands.failures import Refused

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nowhere")  # the tests imported prometheus_client already
    assert serve_command._usable(2) == 2
    monkeypatch.setattr(web_processes.sys, "platform", "darwin")
    assert serve_command._usable(2) == 1
    monkeypatch.delattr(web_processes.os, "fork")
    assert web_processes.unsupported() == "this platform cannot fork"
    assert serve_command._usable(3) == 1
    with pytest.raises(Refused, match="--web-processes must be 1 or more"):
        serve_command._usable(0)


REAPED_THEN_STOPPED = """
import os, signal, threading, time
from tickler.commands import web_processes

handle = web_processes.WebProcesses(1, lambda ready: time.sleep(60) or 0).start()
os.kill(handle.pid, signal.SIGKILL)
deadline = time.monotonic() + 30
while not handle._reaped and time.monotonic() < deadline:
    time.sleep(0.01)
assert handle._reaped
# The moment of the race: the watcher has reaped the supervisor but is still running (logging).
release = threading.Event()
handle._watcher = threading.Thread(target=release.wait, args=(2,), daemon=True)
handle._watcher.start()
signalled = []
os.kill = lambda pid, signum: signalled.append((pid, signum))
handle.stop()
print("signalled", signalled)
"""


SUPERVISOR_STOPPED_AFTER_A_REAP = """
import os, signal, time
from tickler.commands import web_processes

exited = os.fork()
if exited == 0:
    os._exit(0)
os.waitpid(exited, 0)  # reaped by run()'s waitpid(), whose bookkeeping the stop signal cut short
running = os.fork()
if running == 0:
    time.sleep(60)
    os._exit(3)
supervisor = web_processes._Supervisor(2, lambda: 0)
supervisor.children = {exited: time.monotonic(), running: time.monotonic()}
signalled = []
kill = os.kill
os.kill = lambda pid, signum: signalled.append(pid) or kill(pid, signum)
supervisor._stop_children()
print("signalled", signalled == [running], "left", supervisor.children)
"""


def test_the_supervisor_stops_its_children_when_one_was_reaped_as_the_signal_came() -> None:
    """Ctrl-C reaches the supervisor while it reaps a web process that the same Ctrl-C stopped:
    its stop must not wait for (or signal) that pid again — waitpid() found no child and the
    supervisor died with a traceback."""
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISOR_STOPPED_AFTER_A_REAP], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "signalled True left {}" in done.stdout, done.stdout + done.stderr


def test_stop_never_signals_a_supervisor_already_reaped() -> None:
    """Ctrl-C at a terminal reaches serve and its supervisor at once: the supervisor may exit and be
    reaped between stop()'s look at it and its signal. A reaped pid may be another process's by
    then (or none: ProcessLookupError made serve exit 1), so stop() signals only before the reap."""
    done = subprocess.run(
        [sys.executable, "-c", REAPED_THEN_STOPPED], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "signalled []" in done.stdout, done.stdout + done.stderr
