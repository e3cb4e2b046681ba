"""`tickler serve --web-processes N`: N-1 more processes answering HTTP on the parent's socket.

The parent forks one supervisor before it starts any thread or opens any pool. The supervisor
stays single-threaded and holds no connection, so it can fork web processes at any time without
the hazards of forking a threaded process (a lock held by another thread at the fork stays held in
the child for ever): it forks N-1 at start, and another, after a back-off, when one dies. Every
process is tied to its parent's life (PR_SET_PDEATHSIG): a `kill -9` of serve takes the supervisor
and the web processes with it, and the port is free for the next serve. Each web process builds
its own app (its own pool, LISTEN connection and group commit) and runs waitress on the inherited
listening socket; the kernel hands each connection to one of the processes. A web process
builds its app at once but accepts connections only once the parent serves (`release()`): a
client that reaches serve never finds it half-started, without a dispatcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import structlog

log = structlog.get_logger("tickler.serve")

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A web process that lived shorter than this died of something that will kill the next one too:
# its restart waits, twice as long each time (up to the maximum), so that a crash loop does not spin.
HEALTHY_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
# On stop, how long the web processes may take to finish their requests (and their dispatchers
# their deliveries, serve adds that grace) before they are killed.
STOP_GRACE_SECONDS = 10.0


def default_count() -> int:
    """Two processes on a machine with two cores or more (on 2 cores, 16 clients: 1.27x gunicorn), else one."""
    return min(2, os.cpu_count() or 1)


def unsupported() -> str | None:
    """Why this platform runs serve in one process only, or None."""
    if not hasattr(os, "fork"):
        return "this platform cannot fork"
    if not sys.platform.startswith("linux"):
        return "this platform cannot tie a child's life to its parent's (no PR_SET_PDEATHSIG)"
    return None


def private_metrics_dir() -> Path | None:
    """A fresh directory for prometheus-client's multiprocess mode, named in PROMETHEUS_MULTIPROC_DIR
    so that /metrics adds up every process; None when the user named one already. Must run before
    prometheus_client is imported: it reads the variable once, at import. The directories of
    serves that are gone (killed before they could remove theirs) are removed first."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    for old in Path(tempfile.gettempdir()).glob(f"{_METRICS_PREFIX}*"):
        owner = old.name.removeprefix(_METRICS_PREFIX).partition("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(old, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


_METRICS_PREFIX = "tickler-metrics-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _die_with(parent: int) -> None:
    """Be sent SIGTERM when `parent` dies; exit now if it already has (before prctl took effect)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    if os.getppid() != parent:
        os._exit(0)


class _Stop(BaseException):
    """SIGTERM in the supervisor (from serve), raised where it is. Not an Exception: a signal that
    lands while the supervisor writes a log line (the line a test or an operator waits for before
    sending it) would be taken by the logging handler's `except Exception` and the stop lost."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _forked(parent: int, body: Callable[[], int]) -> None:
    """The child's side of a fork: tied to `parent`, runs `body`, and leaves with os._exit, so
    that nothing of the parent's runs at its exit (atexit handlers: the embedded PostgreSQL's)."""
    code = 1
    try:
        _die_with(parent)
        code = body()
    except (KeyboardInterrupt, _Stop):
        code = 0
    except BaseException:
        log.exception("web process failed", pid=os.getpid())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class WebProcesses:
    """The parent's handle on the supervisor and its web processes."""

    def __init__(
        self, count: int, serve_one: Callable[[Callable[[], None]], int], *, stop_grace: float = STOP_GRACE_SECONDS
    ) -> None:
        self.count = count
        self.stop_grace = stop_grace
        # Runs in each web process: builds its app, calls the function it is given (which returns
        # once the parent serves), then serves until stopped.
        self.serve_one = serve_one
        # The gate: the web processes read its end until the parent closes the other (EOF), which
        # it does once it serves; a web process started later finds it open at once.
        self._gate_read, self._gate_write = os.pipe()
        self.pid = 0
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        # Held while the supervisor is reaped and while stop() signals it: a pid is signalled only
        # before it is reaped, when it is still the supervisor's (exited or not), never after.
        self._reaping = threading.Lock()
        self._reaped = False

    def start(self) -> WebProcesses:
        """Fork the supervisor. Call it before this process starts a thread or opens a pool."""
        if threading.active_count() > 1:  # serve forks before its threads; an embedding program may not
            log.warning("forking the web processes' supervisor while threads run", threads=threading.active_count())
        parent = os.getpid()
        pid = _fork(_raise_stop)
        if pid == 0:
            os.close(self._gate_write)  # else the gate could never open: this process would hold it
            gate = self._gate_read
            _forked(
                parent,
                lambda: _Supervisor(
                    self.count, lambda: self.serve_one(lambda: _wait_open(gate)), stop_grace=self.stop_grace
                ).run(),
            )
        os.close(self._gate_read)
        self.pid = pid
        self._watcher = threading.Thread(target=self._watch, name="tickler-web-processes", daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        # Wait for the supervisor's exit without reaping it (WNOWAIT), then reap it under the lock.
        os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        with self._reaping:
            _, status = os.waitpid(self.pid, 0)
            self._reaped = True
        if not self._stopping.is_set():
            log.error(
                "the web processes' supervisor exited; this process serves alone",
                pid=self.pid,
                code=os.waitstatus_to_exitcode(status),
            )

    def release(self) -> None:
        """Let the web processes accept connections: this process serves now."""
        if self._gate_write >= 0:
            os.close(self._gate_write)
            self._gate_write = -1

    def stop(self) -> None:
        """Stop the web processes and wait for them (bounded)."""
        self._stopping.set()
        watcher = self._watcher
        if watcher is None:
            return  # never started
        # A Ctrl-C at a terminal signals the whole group: the supervisor may be exiting, or have
        # exited and been reaped, as this runs. Once reaped its pid may be someone else's.
        if not self._signal(signal.SIGTERM):
            return
        watcher.join(self.stop_grace + 5)
        if watcher.is_alive():
            self._signal(signal.SIGKILL)  # its web processes follow it (PR_SET_PDEATHSIG)
            watcher.join(5)

    def _signal(self, signum: int) -> bool:
        """Signal the supervisor unless it was reaped already (then False)."""
        with self._reaping:
            if self._reaped:
                return False
            os.kill(self.pid, signum)  # not reaped: the pid is still its own, exited or not
            return True


class _Supervisor:
    """Runs in its own single-threaded process: keeps `count` web processes running."""

    def __init__(self, count: int, serve_one: Callable[[], int], *, stop_grace: float = STOP_GRACE_SECONDS) -> None:
        self.count = count
        self.serve_one = serve_one
        self.stop_grace = stop_grace
        self.children: dict[int, float] = {}  # pid -> when it started (monotonic)

    def run(self) -> int:
        _stopped_by_the_parent_only(_raise_stop)
        failures = 0
        try:
            for _ in range(self.count):
                self._spawn()
            while True:
                pid, status = os.waitpid(-1, 0)
                started = self.children.pop(pid, None)
                if started is None:
                    continue
                _mark_dead(pid)
                failures = failures + 1 if time.monotonic() - started < HEALTHY_SECONDS else 0
                delay = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (failures - 1)) if failures else 0.0
                log.error(
                    "web process exited; starting another",
                    pid=pid,
                    code=os.waitstatus_to_exitcode(status),
                    restart_in_seconds=delay,
                )
                time.sleep(delay)
                self._spawn()
        except _Stop:
            pass
        self._stop_children()
        return 0

    def _spawn(self) -> None:
        supervisor = os.getpid()
        pid = _fork(_raise_interrupt)
        if pid == 0:
            _forked(supervisor, self.serve_one)
        self.children[pid] = time.monotonic()

    def _stop_children(self) -> None:
        # A second signal while stopping must not cut the wait short and orphan nobody: ignore it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # The signal that stopped run() may have come between a waitpid() that reaped a child and
        # the bookkeeping after it: such a pid is no longer ours (it may be another process's by
        # now), so it is forgotten, not signalled. A pid not yet reaped is ours, exited or not.
        for pid in list(self.children):
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                reaped = pid
            if reaped:
                del self.children[pid]
                _mark_dead(pid)
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while self.children:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid:
                self.children.pop(pid, None)
                _mark_dead(pid)
                continue
            if time.monotonic() > deadline:
                for pid in self.children:
                    log.warning("web process did not stop in time; killed", pid=pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)


# The signals a terminal sends the whole process group (Ctrl-C, its closing) and the one a parent
# stops its child with.
_STOP_SIGNALS = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}


def _fork(on_sigterm: Callable[[int, FrameType | None], None]) -> int:
    """os.fork(): in the child (0), stopped by its parent's SIGTERM alone, through `on_sigterm`."""
    with _signals_held():
        pid = os.fork()
        if pid == 0:
            _stopped_by_the_parent_only(on_sigterm)
    return pid


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the stop signals back around a fork, so that the child sets its own handlers before
    one can land (the parent's handler would raise in the child, in the parent's code)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stopped_by_the_parent_only(on_sigterm: Callable[[int, FrameType | None], None]) -> None:
    """The supervisor and the web processes stop on their parent's SIGTERM alone. A terminal's
    Ctrl-C or hang-up reaches the whole group at once: had they stopped on it too, the supervisor
    would exit (or see a web process exit) while serve is still stopping its own part, and each
    side would take the other's clean stop for a crash. serve stops them in order instead."""
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _wait_open(gate: int) -> None:
    """Return once the parent serves (the gate's other end is closed: EOF)."""
    while os.read(gate, 1):
        pass


def _mark_dead(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
