"""The import's `--max-invalid N|P%`: how many rows may fail the row checks before the file is refused."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tickler.pipeline.spark import PipelineError

_SPELLING = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class MaxInvalid:
    """At most `count` invalid rows, or at most `percent` of the file's rows."""

    count: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> MaxInvalid:
        match = _SPELLING.match(text)
        if match is None:
            raise ValueError(f"takes a number of rows (100) or a share of them (2.5%), not {text!r}")
        number, percent = match.groups()
        if percent:
            if float(number) > 100:
                raise ValueError(f"a share is at most 100%, not {text!r}")
            return cls(percent=float(number))
        if "." in number:
            raise ValueError(f"a number of rows is a whole number, not {text!r}")
        return cls(count=int(number))

    def allowed(self, rows: int) -> int:
        """How many invalid rows a file of `rows` rows may have."""
        if self.percent is not None:
            return math.floor(rows * self.percent / 100)
        return self.count or 0

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)


class InputRefused(PipelineError):
    """The import's input was refused as a whole: more invalid rows than --max-invalid allows."""
