"""Strict JSON in, compact JSON out.

Python's json module accepts NaN, Infinity and numbers like 1e400 (which become infinity);
none of them is JSON, and PostgreSQL's jsonb refuses them, so they are refused at the door.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flask.json.provider import DefaultJSONProvider


class NotJSON(ValueError):
    """The body is not a JSON text tickler accepts."""


def _reject_constant(name: str) -> Any:
    raise NotJSON(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJSON(f"the number {text} is out of range")
    return value


def loads_strict(text: str | bytes) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except NotJSON:
        raise
    except RecursionError:
        raise NotJSON("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise NotJSON(str(error)) from None


class StrictJSONProvider(DefaultJSONProvider):
    sort_keys = False
    compact = True
    ensure_ascii = False

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads_strict(s)
