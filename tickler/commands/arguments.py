"""What the subcommands check in their arguments: keys, and queue names."""

from __future__ import annotations

import argparse

from tickler.scheduler import rules
from tickler.scheduler.errors import NotFound


def key(value: str) -> str:
    """An argparse type: an item_key, group_key or prefix that the rules accept."""
    problem = rules.check_key(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def check_queue_name(name: str) -> None:
    """NotFound for a name no queue can have (said as such, not as a missing queue)."""
    problem = rules.check_queue_name(name)
    if problem:
        raise NotFound(f"{name!r} cannot name a queue. {problem}")
