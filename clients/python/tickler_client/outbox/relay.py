"""The relay: forwards committed outbox rows to tickler in batches and deletes them once tickler
answered. Run one or several (`Relay(...).run()`, or `tickler-outbox relay`).

Each round, in one transaction of the relay's own connection: pick a batch (the oldest row of
up to `batch_size` keys, locked with SKIP LOCKED), mark the rows as sent on a second,
autocommit connection, send them (`forward.py`), delete what tickler answered, commit. A relay
killed anywhere loses nothing: its transaction rolls back, its row locks go, and the next relay
takes the same rows — checking the marked ones against tickler before sending them again, so
that nothing takes effect twice."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg

from tickler_client.client import Client
from tickler_client.consume import set_from_a_signal
from tickler_client.errors import TicklerError
from tickler_client.outbox._sql import QUERIES
from tickler_client.outbox.forward import Forwarder, Outcome, Row

log = logging.getLogger("tickler_client.outbox")

# The longest pause after a round whose rows got no usable answer (tickler down): doubled from
# `retry_seconds` up to this.
MAX_RETRY_PAUSE = 30.0


@dataclass
class RelayStats:
    """What a relay did: rounds with rows, rows forwarded (answered by tickler, refusals
    included), rows tickler refused, and sends that got no usable answer (retried later)."""

    rounds: int = 0
    forwarded: int = 0
    refused: int = 0
    unanswered: int = 0


class Relay:
    """Forwards the outbox in `database_url` (a libpq URL or DSN) to tickler through `client`.

    `batch_size` bounds the rows of one round (one transaction; one row per key: a key's next
    call goes in the next round); `poll_seconds` is the pause when the outbox is empty;
    `on_refused(row, error)` is called for each row tickler refused for good (it is deleted,
    and logged at WARNING, in any case).

    >>> with Client(url, token) as client:
    ...     Relay("postgresql:///service", client).run()  # until SIGTERM / SIGINT
    """

    def __init__(
        self,
        database_url: str,
        client: Client,
        *,
        batch_size: int = 100,
        poll_seconds: float = 0.5,
        retry_seconds: float = 1.0,
        on_refused: Callable[[Row, TicklerError], object] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be 1 or more")
        self.database_url = database_url
        self.batch_size = batch_size
        self.poll_seconds = poll_seconds
        self.retry_seconds = retry_seconds
        self.forwarder = Forwarder(client, on_refused)
        self.stats = RelayStats()
        self._work: psycopg.Connection[Any] | None = None
        self._marks: psycopg.Connection[Any] | None = None

    def _connections(self) -> tuple[psycopg.Connection[Any], psycopg.Connection[Any]]:
        # Named, so that pg_stat_activity shows which process each relay connection belongs to.
        name = f"tickler-outbox relay {os.getpid()}"
        if self._work is None or self._work.closed:
            self._work = psycopg.connect(self.database_url, application_name=name)
        if self._marks is None or self._marks.closed:
            self._marks = psycopg.connect(self.database_url, autocommit=True, application_name=name)
        return self._work, self._marks

    def run_once(self) -> int:
        """One round: forward one batch; returns how many rows it picked (0: the outbox is empty,
        or every key in it is being sent by another relay)."""
        work, marks = self._connections()
        with work.transaction():
            rows = [
                Row(id=r[0], queue=r[1], item_key=r[2], operation=r[3], body=r[4], tries=r[5], maybe_sent=r[6])
                for r in work.execute(QUERIES["pick"], {"rows": self.batch_size}).fetchall()
            ]
            if not rows:
                return 0
            marks.execute(QUERIES["mark_sent"], {"ids": [row.id for row in rows]})
            outcome = self.forwarder.forward(rows)
            self._settle(work, outcome)
        self.stats.rounds += 1
        self.stats.forwarded += len(outcome.done)
        self.stats.refused += len(outcome.refused)
        self.stats.unanswered += len(outcome.stay)
        return len(rows)

    def _settle(self, work: psycopg.Connection[Any], outcome: Outcome) -> None:
        if outcome.done:
            work.execute(QUERIES["delete_done"], {"ids": outcome.done})
        for reason in set(outcome.stay.values()):
            ids = [row_id for row_id, why in outcome.stay.items() if why == reason]
            work.execute(QUERIES["note_failure"], {"ids": ids, "error": reason[:2000]})
        if outcome.stay:
            log.warning("outbox: %d rows got no usable answer from tickler; sent again later", len(outcome.stay))

    def run(self, stop: threading.Event | None = None, *, handle_signals: bool = True) -> RelayStats:
        """Forward until `stop` is set or SIGINT/SIGTERM arrives (signal handlers only from the
        main thread); the round in progress finishes first. A database that cannot be reached is
        logged and tried again."""
        stop = stop or threading.Event()
        pause = self.retry_seconds
        with _stop_on_signals(stop, handle_signals):
            while not stop.is_set():
                unanswered_before = self.stats.unanswered
                try:
                    picked = self.run_once()
                except psycopg.OperationalError as error:
                    log.warning("outbox: database unreachable (%s); trying again", error)
                    self._close_connections()
                    stop.wait(pause)
                    pause = min(pause * 2, MAX_RETRY_PAUSE)
                    continue
                if picked == 0:
                    stop.wait(self.poll_seconds)
                elif self.stats.unanswered > unanswered_before:  # tickler down, or a wrong token
                    stop.wait(pause)
                    pause = min(pause * 2, MAX_RETRY_PAUSE)
                else:
                    pause = self.retry_seconds
        self._close_connections()
        return self.stats

    def _close_connections(self) -> None:
        for conn in (self._work, self._marks):
            if conn is not None:
                conn.close()
        self._work = self._marks = None

    def close(self) -> None:
        self._close_connections()

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, enabled: bool) -> Iterator[None]:
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda signum, frame: set_from_a_signal(stop))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
