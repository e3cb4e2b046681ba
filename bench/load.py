"""The machine's load while a scenario runs: the 1-minute load average, sampled in the background.

On a shared box the rates of one run depend on what else runs beside it; the report states the
range each scenario ran under, so that no one has to add it to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

INTERVAL = 5.0  # seconds between samples


class LoadSampler:
    """`with LoadSampler() as load: ...` then `load.range()`: (lowest, highest) 1-minute load average."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-load", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def range(self) -> tuple[float, float]:
        return (min(self.samples), max(self.samples)) if self.samples else (0.0, 0.0)
