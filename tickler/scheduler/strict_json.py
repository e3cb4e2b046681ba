"""Strict JSON reading: what tickler accepts as JSON, wherever it comes from (an API body, an
import file's `data` cell). Python's json module accepts NaN, Infinity and numbers like 1e400
(which become infinity); none of them is JSON, and PostgreSQL's jsonb refuses them, so they are
refused here, as are objects that name a key twice."""

from __future__ import annotations

import json
import math
from typing import Any


class NotJSON(ValueError):
    """The body is not a JSON text tickler accepts."""


def _reject_constant(name: str) -> Any:
    raise NotJSON(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJSON(f"the number {text} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python keeps the last of two equal keys, other parsers the first: a body read one way by a
    # proxy or a signature check and another way here is how checks get bypassed. Refuse it.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise NotJSON(f"the key {twice!r} appears twice in one object")
    return obj


def loads_strict(text: str | bytes) -> Any:
    try:
        return json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except NotJSON:
        raise
    except RecursionError:
        raise NotJSON("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise NotJSON(str(error)) from None
