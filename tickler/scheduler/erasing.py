"""Erasing a subject (SPEC §12): the keyed hash of an erased value, and the runner that takes an
erasure from pending to done in bounded batches.

An erased key or group becomes `erased:` + HMAC-SHA256 (hex) of the value under a key derived
from the installation's secret (TICKLER_SECRET_KEY, else the key the dashboard keeps in the
database): the same value always gives the same hash, so `GET /v1/erasures?item_key=` can answer
without the log holding the value, and nobody without the secret can test a guess against it.
The hashes are made here, not in SQL: PostgreSQL has no HMAC without pgcrypto, which the embedded
server lacks.

The runner is the dispatcher's periodic job (and `tickler erase --wait`): every step is a
transaction of its own (scheduler/database/erasing.sql), so a process killed at any point leaves
committed batches and the next run goes on from them; batches of an erasure take its log row's
lock, so two runners take turns.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
import structlog

from tickler.scheduler.errors import Invalid
from tickler.scheduler.store.dashboard import DashboardStore
from tickler.scheduler.store.erasures import Erasure, ErasureStore, Selector, Walk
from tickler.scheduler.store.queues import QueueStore

log = structlog.get_logger(__name__)

ERASED_PREFIX = "erased:"
# Rows per batch (one transaction): short enough never to hold claims or scheduling up for long.
BATCH_ROWS = 1000
# How often a dispatcher looks for a pending erasure: one index probe when there is none.
INTERVAL_SECONDS = 5.0
# A finished event is looked for once more, under the lock that closes the erasure, if it
# finished this long before the last pass began (a finish commits after its clock was read).
FINISH_MARGIN = timedelta(minutes=10)
# An erasure that took leases away is done this long after the last of them expired: their holders
# stop sending at their lease's end (the dispatcher checks it before each request), and what was
# sent just before has reached the receiver by then.
LEASE_MARGIN_SECONDS = 2.0
# The walk through history: each range of dequeued_on is sized to take about this long to read.
WALK_SECONDS = 0.1
MIN_WALK_STEP = timedelta(seconds=1)
MAX_WALK_STEP = timedelta(days=31)
EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
# What `note` says of an erasure done in the database while the archive has files: they are next.
ARCHIVE_NOTE = "The database holds nothing of the subject; the archive's files wait for `tickler pipeline erase`."

# A shorter prefix would sweep up unrelated keys (`a` is every key that starts with a).
MIN_PREFIX_LENGTH = 3

_DERIVATION = b"tickler erasure v1"
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out


def erasure_key(secret: str) -> bytes:
    """The key of the erasure hashes, derived from the installation's secret (the session key is
    never used as is for a second purpose)."""
    return hmac.new(secret.encode(), _DERIVATION, hashlib.sha256).digest()


def erased_value(key: bytes, value: str) -> str:
    """What an erased key or group becomes, and how the log names it."""
    return ERASED_PREFIX + hmac.new(key, value.encode(), hashlib.sha256).hexdigest()


class Hasher:
    """The keyed hash of this installation: from the configured secret, else the database's key.
    The database's key is read again for each use (an erasure's run, a request), never cached
    for the life of a process: every process hashes with the key the database holds now."""

    def __init__(self, engine: sa.Engine, secret: str = "") -> None:
        self._engine = engine
        self._secret = secret

    def bound(self) -> Callable[[str], str]:
        """The hash function under the current key."""
        key = erasure_key(self._secret or DashboardStore(self._engine).session_secret())
        return lambda value: erased_value(key, value)

    def __call__(self, value: str) -> str:
        return self.bound()(value)


def request(engine: sa.Engine, selector: Selector, *, reason: str, requested_by: str, secret: str) -> Erasure:
    """Log an erasure, pending (the API's and the command line's one way): Invalid names the
    field of a queue that does not exist or a prefix too short; nothing is written then."""
    if selector.item_key_prefix is not None and len(selector.item_key_prefix) < MIN_PREFIX_LENGTH:
        raise Invalid(
            "The prefix is too short.",
            errors={"item_key_prefix": [f"A prefix has at least {MIN_PREFIX_LENGTH} characters."]},
        )
    if selector.queues is not None:
        known = {queue.name for queue in QueueStore(engine).list()}
        unknown = sorted(set(selector.queues) - known)
        if unknown:
            raise Invalid("Unknown queue.", errors={"queues": [f"No queue {unknown[0]!r}."]})
    hashed = Hasher(engine, secret).bound()
    named = [selector.group_key, selector.item_key_prefix, *(selector.item_keys or ())]
    erasure = ErasureStore(engine).request(
        selector,
        reason=reason,
        requested_by=requested_by,
        hashes={value: hashed(value) for value in named if value is not None},
    )
    # The operations log (SPEC §7) recorded "erasure requested" with it (ErasureStore.request).
    log.info("erasure_requested", erasure_id=erasure.id, actor=requested_by)
    return erasure


class Eraser:
    """Runs erasures to their end."""

    def __init__(self, engine: sa.Engine, hasher: Hasher, *, batch_rows: int = BATCH_ROWS) -> None:
        self.store = ErasureStore(engine)
        self.hasher = hasher
        self.batch_rows = batch_rows

    def run_unfinished(self) -> list[int]:
        """Run every unfinished erasure, oldest first; returns those it finished."""
        return [erasure_id for erasure_id in self.store.unfinished() if self.run(erasure_id)]

    def run(self, erasure_id: int) -> bool:
        """Erase batch after batch until nothing is left, walking history range by range, then
        close the erasure (False: it could not take the short lock that closes it, or a lease it
        took away has not expired yet; a later run does). Database errors propagate."""
        hashed = self.hasher.bound()
        self._schedules(erasure_id, hashed)  # first: no occurrence of theirs is enqueued after this
        while True:
            found = self.store.walk(erasure_id)
            if found is not None:
                walked_to, oldest_day, now = found
                # Resumed: from a margin before, for finishes that committed after their range was read.
                start = EARLIEST if walked_to is None else walked_to - FINISH_MARGIN
                # A first walk's first range ends where the oldest day begins (no days: it is all of it).
                first_to = (oldest_day or now) if walked_to is None else None
                if not self._walk(erasure_id, hashed, start, first_to, now):
                    return False
                since = now - FINISH_MARGIN
            else:
                since = self.store.now() - FINISH_MARGIN
            if not self._batches(erasure_id, hashed, None):
                return False
            self._schedules(erasure_id, hashed)  # one created while the erasure ran
            try:
                finished = self.store.finish(erasure_id, since, ARCHIVE_NOTE, LEASE_MARGIN_SECONDS)
            except sa.exc.OperationalError as error:
                if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                return False  # writers held the open events: the next run closes it
            if finished == "done":
                log.info("erasure_done", erasure_id=erasure_id)
                return True
            if finished == "leases_held":
                return False  # a holder may still be sending: a run after the leases' expiry closes it
            self.store.walked(erasure_id, since)  # rows finished since the walk began: again from there

    def _walk(
        self, erasure_id: int, hashed: Callable[[str], str], start: datetime, first_to: datetime | None, end: datetime
    ) -> bool:
        """Walk history from `start` to `end` by ranges of dequeued_on, each sized to take about
        WALK_SECONDS to read (the first, from the earliest time, ends at the oldest day's start)."""
        step = timedelta(hours=1)
        while start < end:
            to = first_to if first_to is not None and first_to < end else min(start + step, end)
            first_to = None
            began = time.monotonic()
            if not self._batches(erasure_id, hashed, (start, to)):
                return False
            took = time.monotonic() - began
            if took < WALK_SECONDS / 4:
                step = min(step * 2, MAX_WALK_STEP)
            elif took > WALK_SECONDS:
                step = max(step / 2, MIN_WALK_STEP)
            self.store.walked(erasure_id, to)
            start = to
        return True

    def _schedules(self, erasure_id: int, hashed: Callable[[str], str]) -> None:
        """Delete the recurring schedules of the subject (their group, or keys its prefix covers),
        with their keys' timelines erased (tickler_erase_schedules)."""
        values = self.store.schedule_values(erasure_id)
        if values:
            self.store.erase_schedules(erasure_id, {v: hashed(v) for v in values})

    def _batches(self, erasure_id: int, hashed: Callable[[str], str], walk: Walk | None) -> bool:
        """Erase batches of open events and the walk's range (or, without one, timeline keys)
        until none is left; False when two batches in a row erased nothing (rows changed since
        their values were read: not worth spinning on, a later run goes on)."""
        idle = 0
        while values := self.store.values(erasure_id, self.batch_rows, walk):
            erased = self.store.erase_batch(erasure_id, {v: hashed(v) for v in values}, self.batch_rows, walk)
            idle = 0 if erased else idle + 1
            if idle >= 2:
                return False
        return True

    def run_or_fail(self, erasure_id: int) -> bool:
        """run(), with a mistake of the data (not of the database's availability) failing the erasure."""
        try:
            return self.run(erasure_id)
        except (sa.exc.IntegrityError, sa.exc.DataError) as error:
            note = f"stopped by {type(error.orig).__name__}; request the erasure again"
            log.error("erasure_failed", erasure_id=erasure_id, error=type(error.orig).__name__)
            self.store.fail(erasure_id, note)
            return False


def periodic(eraser: Eraser) -> Callable[[], None]:
    """The dispatcher's job: run the unfinished erasures, logging (not raising) database trouble."""

    def run() -> None:
        for erasure_id in eraser.store.unfinished():
            try:
                eraser.run_or_fail(erasure_id)
            except sa.exc.DBAPIError as error:
                # Never the message: it may quote a row's values. The next run goes on.
                log.warning("erasure_interrupted", erasure_id=erasure_id, error=type(error.orig).__name__)
                return

    return run
