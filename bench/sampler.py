"""Sampling in the background while a `with` block runs: once on entering, every `interval`
seconds from a daemon thread, and once more on leaving (so that the last stretch counts)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self


class Sampler:
    """A subclass says what one sample is (`sample`); `lost` are the errors after which the
    background thread stops sampling (the samples on entering and leaving still raise them)."""

    lost: tuple[type[Exception], ...] = ()

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def sample(self, *, first: bool = False) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except self.lost:
                return

    def __enter__(self) -> Self:
        self.sample(first=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
