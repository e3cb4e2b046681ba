"""The embeddable worker (SPEC §5): register a handler per queue, then run.

    from tickler.scheduler.worker import Worker

    worker = Worker()                      # settings from TICKLER_* environment variables

    @worker.handler("emails")
    def send(event): ...                   # returning = delivered, raising = failed attempt

    @worker.group_handler("digests")
    def digest(events): ...                # all due events of one group, one lease

    worker.run()                           # until SIGTERM / SIGINT

Same claims, leases, retries and timeline as every other delivery mode.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict
from types import FrameType
from typing import Any

import sqlalchemy as sa
import structlog

from tickler.config import Settings
from tickler.scheduler.db import DATABASE_ERRORS, create_engine, driver_rows, resolve_database_url
from tickler.scheduler.delivery import Deliverer
from tickler.scheduler.delivery.handlers import EventHandler, GroupHandler, HandlerDeliverer, Handlers
from tickler.scheduler.delivery.webhook import WebhookDeliverer
from tickler.scheduler.dispatcher import Dispatcher, DispatcherConfig
from tickler.scheduler.migrate import MigrationError, migrate, pending_migrations, pending_summary
from tickler.scheduler.store import Store
from tickler.scheduler.wakeup import WakeupListener

log = structlog.get_logger(__name__)


def _refuse_unmigrated(url: str, connect_timeout: int) -> None:
    """A worker told not to migrate stops at start, in one line, on a database that lacks steps it
    needs, instead of failing every claim on a missing table. Steps of a newer release are no reason
    (an upgrade migrates first, while this release still runs)."""
    pending = pending_migrations(url, allow_newer=True, connect_timeout=connect_timeout)
    if pending:
        raise MigrationError(f"the database is not migrated: {pending_summary(pending)}; run `tickler migrate` first")


def _warn_without_autovacuum(engine: sa.Engine) -> None:
    """Without autovacuum, dead entries pile up in the claim indexes and every claim slows down
    (see migrations/0004_vacuum.sql): say so where operators look."""
    try:
        [[setting]] = driver_rows(engine, "SHOW autovacuum", tuples=True, prepare=False)
    except DATABASE_ERRORS as error:
        # The database is away (restarting): the dispatcher's loops wait for it; starting must
        # not fail for a warning.
        log.warning("autovacuum_unknown", error=str(error).splitlines()[0])
        return
    if setting != "on":
        log.warning(
            "autovacuum_off",
            detail="PostgreSQL runs with autovacuum = off: claims will slow down as events finish. "
            "Turn it on, or VACUUM tickler_event regularly.",
        )


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    def __init__(
        self,
        handlers: Handlers | None = None,
        *,
        settings: Settings | None = None,
        database_url: str | None = None,
        name: str | None = None,
        deliver_webhooks: bool = False,
        engine: sa.Engine | None = None,
        **config: Any,
    ) -> None:
        """`config` sets DispatcherConfig fields (batch_size, concurrency, poll_interval, ...); the
        others are the settings' (`settings.worker`: TICKLER_WORKER_* or the defaults)."""
        self.handlers = handlers or Handlers()
        self.settings = settings or Settings.from_env()
        self._database_url = database_url
        self._engine = engine
        self._owns_engine = False
        self.name = name or default_worker_name()
        self.deliver_webhooks = deliver_webhooks
        self._config = config
        self._dispatcher: Dispatcher | None = None
        self._done = threading.Event()

    def handler(self, queue: str) -> Callable[[EventHandler], EventHandler]:
        return self.handlers.handler(queue)

    def group_handler(self, queue: str) -> Callable[[GroupHandler], GroupHandler]:
        return self.handlers.group_handler(queue)

    def start(self) -> Dispatcher:
        """Start delivering in background threads; returns the dispatcher (stop it with stop())."""
        url = self._database_url or resolve_database_url(self.settings.database_url, self.settings.data_dir)
        if self._engine is None:
            if self.settings.migrate_on_start:
                migrate(url, connect_timeout=self.settings.connect_timeout)
            else:
                _refuse_unmigrated(url, self.settings.connect_timeout)
            self._engine = create_engine(
                url, pool_size=self.settings.pool_size, connect_timeout=self.settings.connect_timeout
            )
            self._owns_engine = True
        _warn_without_autovacuum(self._engine)
        handler_deliverer = HandlerDeliverer(self.handlers)
        deliverers: dict[str, Deliverer] = {queue: handler_deliverer for queue in self.handlers.queues}
        self._dispatcher = Dispatcher(
            Store(self._engine),
            WakeupListener(url, connect_timeout=self.settings.connect_timeout),
            DispatcherConfig(worker_name=self.name, **(asdict(self.settings.worker) | self._config)),
            deliverers=deliverers,
            webhook=WebhookDeliverer() if self.deliver_webhooks else None,
            secret_key=self.settings.secret_key,
        ).start()
        return self._dispatcher

    def stop(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.stop()
        if self._owns_engine and self._engine is not None:
            # An engine this worker made is closed with it: its pooled connections would otherwise
            # stay open for the life of an embedding program (and warn when collected).
            self._engine.dispose()
        self._done.set()

    def run(self) -> None:
        """Deliver until SIGTERM or SIGINT, then stop gracefully (see Dispatcher.stop)."""
        requested = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            requested.set()  # the main thread stops the worker; a handler must not block

        # The handlers go in before start(): deliveries begin while start() is still running, and
        # a SIGTERM then must still give their leases back, not kill the process.
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not requested.wait(1.0) and not self._done.is_set():
                pass
            if not self._done.is_set():
                self.stop()
            if self._dispatcher is not None:
                self._dispatcher.wait_stopped(timeout=self._dispatcher.config.shutdown_grace + 10)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
