"""What the subcommands check in their arguments: keys, and queue names."""

from __future__ import annotations

import argparse
import getpass
import os

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


def command_actor() -> str:
    """Who the operations log names for a change made by a command: the account that ran it (the
    command reaches the database directly, with no token to name)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = str(os.getuid())
    return f"cli:{user}"
