"""The machine's load while a scenario runs: the 1-minute load average, sampled in the background.

On a shared box the rates of one run depend on what else runs beside it; the report states the
range each scenario ran under, so that no one has to add it to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import os

from bench.sampler import Sampler

INTERVAL = 5.0  # seconds between samples


class LoadSampler(Sampler):
    """`with LoadSampler() as load: ...` then `load.range()`: (lowest, highest) 1-minute load average."""

    def __init__(self, interval: float = INTERVAL) -> None:
        super().__init__(interval, "bench-load")
        self.samples: list[float] = []

    def sample(self, *, first: bool = False) -> None:
        self.samples.append(os.getloadavg()[0])

    def range(self) -> tuple[float, float]:
        return (min(self.samples), max(self.samples)) if self.samples else (0.0, 0.0)
