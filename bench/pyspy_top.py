"""The top frames of a py-spy raw (collapsed) profile: each function's inclusive share of the
samples (a function counted once per sample however deep it recurs), for bench/analysis.md.

    .venv/bin/python -m bench.pyspy_top profile.txt [--top 30] [--only gunicorn]

py-spy records busy samples only (no --idle), so the shares are of the CPU the profile saw.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(.*) \(([^()]*?)(?::\d+)?\)$")


def top(path: Path, *, only: str = "", count: int = 30) -> list[tuple[str, float]]:
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit() or (only and only not in stack):
            continue
        n = int(samples)
        total += n
        seen = set()
        for frame in stack.split(";"):
            if frame.startswith("process "):
                continue
            found = _FRAME.match(frame)
            name = f"{found.group(1)} ({found.group(2)})" if found else frame
            if name not in seen:
                seen.add(name)
                inclusive[name] += n
    return [(name, n / max(1, total)) for name, n in inclusive.most_common(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--only", default="", help="only stacks holding this text")
    args = parser.parse_args()
    for name, share in top(args.profile, only=args.only, count=args.top):
        print(f"{share * 100:5.1f} %  {name}")


if __name__ == "__main__":
    main()
