"""What the subcommands check in their arguments: keys, and queue names."""

from __future__ import annotations

import argparse
import getpass
import os
from collections.abc import Callable

from tickler.scheduler import rules
from tickler.scheduler.errors import NotFound


def checked(check: Callable[[str], str | None]) -> Callable[[str], str]:
    """An argparse type: the value as given, once `check` finds no problem in it (the problem it
    finds is the error argparse shows)."""

    def argument(value: str) -> str:
        problem = check(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return argument


# An item_key, group_key or prefix that the rules accept.
key = checked(rules.check_key)


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
