"""Waiting for work in tests: poll a condition with a deadline, never sleep a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 15.0, *, interval: float = 0.05, what: str | Callable[[], str] = ""
) -> T:
    """Poll `predicate` until it returns something truthy and return that; fail after `timeout` s.

    `what` describes the wait in the failure message (a callable is asked only on failure, so it
    can report the state at that moment)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"not done within {timeout} s: {detail}")
        time.sleep(interval)
