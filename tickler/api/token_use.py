"""When each API token was last used, kept in `tickler_token.last_used_on` without a write per
request: each process remembers when it last wrote a token's time and writes again only once a
minute has passed (the UPDATE also skips a row another process wrote within the minute). So the
time shown is exact to the minute, and a busy token costs one small UPDATE a minute per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from tickler.scheduler.store.tokens import TokenStore

log = structlog.get_logger(__name__)

# A token's last use is written at most this often, per process (seconds).
EVERY_SECONDS = 60.0


class TokenUse:
    def __init__(
        self, tokens: TokenStore, *, every: float = EVERY_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._tokens = tokens
        self._every = every
        self._clock = clock
        self._written: dict[bytes, float] = {}  # token hash -> when this process last wrote it
        self._lock = threading.Lock()

    def used(self, token_hash: bytes) -> None:
        """A request was authenticated with the token of this hash."""
        now = self._clock()
        with self._lock:
            last = self._written.get(token_hash)
            if last is not None and now - last < self._every:
                return
            self._written[token_hash] = now
        try:
            self._tokens.mark_used(token_hash)
        except Exception:  # a bookkeeping write never fails the request it records
            log.warning("token_use_not_recorded", exc_info=True)
            with self._lock:
                self._written.pop(token_hash, None)  # try again on the next request
