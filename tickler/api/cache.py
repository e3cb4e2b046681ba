"""A small in-process cache with a time to live, for per-request lookups that rarely change.

Entries are also dropped when told (`forget`, `clear`: the API does it on NOTIFYs from other
processes), and an entry whose load raced with such a drop is not kept: the load may have read
the row just before it changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


def _always() -> bool:
    return True


class TTLCache(Generic[V]):
    def __init__(
        self, seconds: float, *, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by every drop
        # False while drops may be missed (the LISTEN connection is down): then nothing is cached.
        self.trusted: Callable[[], bool] = _always

    def get(self, key: Hashable, load: Callable[[], V | None]) -> V | None:
        """The cached value, or `load()` (cached when not None)."""
        if self.seconds <= 0 or not self.trusted():
            return load()
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        generation = self._generation
        value = load()
        if value is not None:
            with self._lock:
                if self._generation != generation:
                    return value  # dropped while loading: maybe stale, do not keep it
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
                self._entries[key] = (now + self.seconds, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._generation += 1
            self._entries.pop(key, None)
