"""Wake-ups: one LISTEN connection per process turns NOTIFYs into local wake-ups.

Waiters take a `mark()` before they look for work and then `wait(mark, ...)`: a notification
that arrives between the look and the wait is not lost, because it moves the generation counter
past the mark. While the LISTEN connection is down, every waiter is woken (so it polls), and
`connected` is cleared so that dispatchers shorten their sleeps until it is back.

The same connection also listens on CACHE_CHANNEL, whose notifications wake no one: they go,
with every settings change ("~" + queue), to the callbacks given to `subscribe()` (the API's
caches of tokens and queues), and UNKNOWN goes to them whenever notifications may have been missed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import psycopg
import structlog
from psycopg import sql

from tickler.scheduler.db import DEFAULT_CONNECT_TIMEOUT, libpq_url

log = structlog.get_logger(__name__)

CHANNEL = "tickler_wake"
# In take_recent(): notifications may have been missed (the connection was down).
UNKNOWN = "*"
# A payload starting with it says a queue's settings changed (queue names never contain it).
SETTINGS_CHANGED = "~"
# Cached things that changed: "token:<hex of the token's sha256>" (revoked).
CACHE_CHANNEL = "tickler_cache"


class WakeupListener:
    def __init__(
        self, database_url: str, *, reconnect_delay: float = 0.5, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    ) -> None:
        self._url = libpq_url(database_url)
        self._connect_timeout = connect_timeout
        self._reconnect_delay = reconnect_delay
        self._cond = threading.Condition()
        self._generations: dict[str, int] = {}
        self._everything = 0  # bumped when every waiter must look (reconnects, stop)
        self._any = 0  # bumped by every notification, for waiters on all queues
        self._recent: set[str] = set()  # queues notified since take_recent()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscribers: list[Callable[[str], None]] = []
        self.connected = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> WakeupListener:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tickler-listen", daemon=True)
            self._thread.start()
        return self

    def subscribe(self, callback: Callable[[str], None]) -> None:
        """Call `callback(payload)` from the listening thread for each CACHE_CHANNEL notification,
        each settings change ("~" + queue), and UNKNOWN when notifications may have been missed."""
        with self._cond:
            self._subscribers.append(callback)

    def _publish(self, payload: str) -> None:
        with self._cond:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(payload)
            except Exception:  # a subscriber's bug must not stop the wake-ups
                log.exception("listen_subscriber_error", payload=payload)

    def stop(self) -> None:
        self._stopping.set()
        self.poke()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- waiting ----------------------------------------------------------------------------------

    def mark(self, queues: Iterable[str] | None) -> tuple[int, ...]:
        """The current state of `queues` (None: of every queue), to pass to wait()."""
        with self._cond:
            return self._state(None if queues is None else sorted(set(queues)))

    def wait(self, queues: Iterable[str] | None, mark: tuple[int, ...], timeout: float) -> bool:
        """Block until a queue of `queues` (None: any queue) is notified after `mark`, or for
        `timeout` seconds; True if woken."""
        names = None if queues is None else sorted(set(queues))
        with self._cond:
            return self._cond.wait_for(
                lambda: self._state(names) != mark or self._stopping.is_set(), timeout=max(0.0, timeout)
            )

    def _state(self, names: list[str] | None) -> tuple[int, ...]:
        if names is None:
            return (self._everything, self._any)
        return (self._everything, *(self._generations.get(q, 0) for q in names))

    def take_recent(self) -> set[str]:
        """The payloads notified since the last call: queue names, SETTINGS_CHANGED + name, or
        UNKNOWN when notifications may have been missed."""
        with self._cond:
            recent, self._recent = self._recent, set()
            return recent

    def _notified(self, payload: str) -> None:
        with self._cond:
            self._recent.add(payload)
        self.poke(payload.removeprefix(SETTINGS_CHANGED))

    def poke(self, queue: str | None = None) -> None:
        """Wake waiters locally: those of `queue`, or all of them."""
        with self._cond:
            if queue is None:
                self._everything += 1
            else:
                self._generations[queue] = self._generations.get(queue, 0) + 1
                self._any += 1
            self._cond.notify_all()

    # -- the LISTEN connection --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with psycopg.connect(
                    self._url,
                    autocommit=True,
                    application_name="tickler-listen",
                    connect_timeout=self._connect_timeout,
                ) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CACHE_CHANNEL)))
                    self.connected.set()
                    with self._cond:
                        # Notifications sent while we were not listening are lost: whoever
                        # waits must look again, and must not assume it knows every queue.
                        self._recent.add(UNKNOWN)
                    self._publish(UNKNOWN)
                    self.poke()
                    while not self._stopping.is_set():
                        for notification in conn.notifies(timeout=1.0):
                            if notification.channel == CACHE_CHANNEL:
                                self._publish(notification.payload)
                            else:
                                if notification.payload.startswith(SETTINGS_CHANGED):
                                    self._publish(notification.payload)
                                self._notified(notification.payload)
                            if self._stopping.is_set():
                                break
            except psycopg.Error as error:
                if not self._stopping.is_set():
                    log.warning("listen_connection_lost", error=str(error))
            finally:
                self.connected.clear()
                self._publish(UNKNOWN)
                self.poke()
            self._stopping.wait(self._reconnect_delay)
