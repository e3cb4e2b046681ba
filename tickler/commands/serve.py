"""`tickler serve`: the API and a dispatcher in one process, and both again in more processes beside
it (`--web-processes`, commands/web_processes.py).

Start-up goes from cheap to expensive so that a mistake stops it before anything runs: the port
is bound first (in use, or a host that does not resolve: one line, nothing started), then the
database is named, reached and migrated, then the other web processes are forked (before this one
starts a thread or opens a pool; each answers once its own app is built), then the dispatcher
starts, and only then this process answers too. Ctrl-C or SIGTERM at any moment stops what had
started, and nothing else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

import structlog

from tickler.commands import web_processes
from tickler.commands.failures import Refused, databases
from tickler.config import Settings

log = structlog.get_logger("tickler.serve")


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or Refused saying why not (in use, no such address)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as error:
        raise Refused(
            f"cannot listen on {host!r}: the address does not resolve ({error}); try --host 127.0.0.1"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "posix":  # what waitress does: a restart may bind while old connections linger
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        sock.close()
        if error.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise Refused(
                f"port {port} on {host} is already in use (another tickler serve?); stop it or pick another with --port"
            ) from None
        raise Refused(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve(settings: Settings, host: str, port: int, threads: int, processes: int | None = None) -> int:
    """Run until SIGTERM or SIGINT; 0 when stopped so. Refused (one line, exit 2) for a mistake.
    `processes`: web processes (None: web_processes.default_count())."""
    # First of all: a shell starts a background job (`tickler serve &`) with SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler; SIGTERM stops the same way. So does
    # SIGHUP (the terminal closed): its default would end this process without stopping the
    # embedded PostgreSQL, which runs in a session of its own. Under nohup it stays ignored.
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _raise_interrupt)
    processes = _usable(web_processes.default_count() if processes is None else processes)
    sock = bind(host, port)
    serving = False

    def now_serving() -> None:
        nonlocal serving
        serving = True

    with contextlib.ExitStack() as started:
        started.callback(sock.close)
        if processes > 1:
            metrics_dir = web_processes.private_metrics_dir()  # before prometheus_client is imported
            if metrics_dir is not None:
                started.callback(shutil.rmtree, metrics_dir, ignore_errors=True)
        try:
            return _start_and_run(settings, sock, threads, processes, started, now_serving)
        except KeyboardInterrupt:
            # Everything started so far is stopped by the ExitStack, in reverse order.
            if serving:
                return 0
            raise Refused("interrupted while starting; nothing was left running", exit_code=130) from None


def _usable(processes: int) -> int:
    """How many web processes serve can run here: `processes`, or one with a line saying why."""
    if processes < 1:
        raise Refused(f"--web-processes must be 1 or more, not {processes}")
    if processes == 1:
        return 1
    why = web_processes.unsupported()
    if why is None and "prometheus_client" in sys.modules and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        why = "prometheus_client was imported before serve: /metrics could not add up the processes"
    if why is not None:
        log.warning("serving with one web process", asked=processes, reason=why)
        return 1
    return processes


def _start_and_run(
    settings: Settings,
    sock: socket.socket,
    threads: int,
    processes: int,
    started: contextlib.ExitStack,
    now_serving: Callable[[], None],
) -> int:
    import waitress

    from tickler.api import close_app, create_app
    from tickler.scheduler.db import resolve_database_url
    from tickler.scheduler.migrate import migrate
    from tickler.scheduler.worker import Worker

    where = databases(settings)
    log.info("database", **where)  # before reaching it: a failure then names what it tried
    url = resolve_database_url(settings.database_url, settings.data_dir)
    if settings.migrate_on_start:
        migrate(url, connect_timeout=settings.connect_timeout)
    settings = settings.with_overrides(database_url=url, migrate_on_start=False)
    if processes > 1:
        # Not listening yet: until this process's waitress listens (once it is ready), a client
        # is refused at once, as with one process, rather than left waiting in the backlog.

        def serve_one(wait_for_parent: Callable[[], None]) -> int:
            return _serve_web_process(settings, sock, threads, wait_for_parent)

        # A web process's dispatcher may take its shutdown grace on stop, as this one's does.
        stop_grace = web_processes.STOP_GRACE_SECONDS + settings.worker.shutdown_grace
        others = web_processes.WebProcesses(processes - 1, serve_one, stop_grace=stop_grace).start()
        started.callback(others.stop)
        log.info("web processes", count=processes, metrics_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    app = create_app(settings, configure_logs=False)
    started.callback(close_app, app)
    ext = app.extensions["tickler"]
    worker = Worker(settings=settings, database_url=url, engine=ext.store.engine, deliver_webhooks=True)
    worker.start()
    started.callback(worker.stop)
    server = waitress.create_server(app, sockets=[sock], threads=threads, ident="tickler")
    started.callback(server.close)
    bound_host, bound_port = sock.getsockname()[:2]
    base = f"http://{_url_host(bound_host)}:{bound_port}"
    log.info(
        "serving",
        url=base,
        api=f"{base}/v1",
        dashboard=f"{base}/ui/",
        docs=f"{base}/docs",
        **where,
        pid=os.getpid(),
        threads=threads,
        web_processes=processes,
    )
    warn_of_plain_cookies(settings, bound_host)
    now_serving()
    if processes > 1:
        others.release()
    server.run()
    return 0


def beyond_loopback(host: str) -> bool:
    """Whether a socket bound to `host` can be reached from other machines."""
    try:
        return not ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return True  # a name: it bound to whatever the name resolves to


def warn_of_plain_cookies(settings: Settings, host: str) -> None:
    """Once, at start: listening beyond this machine while the dashboard's session cookie may go
    over plain HTTP. Behind a TLS proxy that is what TICKLER_SECURE_COOKIES=true is for."""
    if beyond_loopback(host) and not settings.secure_cookies:
        log.warning(
            "dashboard cookies without Secure",
            host=host,
            detail="listening beyond this machine without TICKLER_SECURE_COOKIES=true: the dashboard's "
            "session cookie is also sent over plain HTTP; serve it behind HTTPS and set TICKLER_SECURE_COOKIES=true",
        )


def _serve_web_process(
    settings: Settings, sock: socket.socket, threads: int, wait_for_parent: Callable[[], None]
) -> int:
    """One of the other web processes: its own app (pool, LISTEN connection, group commit), a
    waitress on the parent's socket and a dispatcher, from when the parent serves until SIGTERM or
    SIGINT. A dispatcher in every process, not in the parent alone: a process's webhooks share
    one event loop, whose CPU bounds their rate (docs/delivery.md), and each process adds its own."""
    import waitress

    from tickler.api import close_app, create_app
    from tickler.scheduler import tracing
    from tickler.scheduler.worker import Worker

    app = create_app(settings, configure_logs=False)
    worker: Worker | None = None
    try:
        wait_for_parent()  # until then the parent alone will accept: it runs its dispatcher first
        engine = app.extensions["tickler"].store.engine
        worker = Worker(settings=settings, database_url=settings.database_url, engine=engine, deliver_webhooks=True)
        worker.start()
        server = waitress.create_server(app, sockets=[sock], threads=threads, ident="tickler")
        try:
            server.run()  # returns on KeyboardInterrupt (SIGTERM, SIGINT)
        finally:
            server.close()
    finally:
        if worker is not None:
            worker.stop()  # deliveries in progress finish within the grace; the rest are given back
        close_app(app)
        tracing.flush()  # the process leaves with os._exit: no atexit handler exports what is buffered
    return 0


def _url_host(host: str) -> str:
    """How a listening address is written in a URL a person can open."""
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    return f"[{host}]" if ":" in host else host
