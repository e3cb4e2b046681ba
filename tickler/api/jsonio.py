"""Strict JSON in, compact JSON out.

Bodies are read by scheduler/strict_json.py (no NaN, Infinity, 1e400 or key named twice), the
same reader the importer uses for its `data` cells.

Output goes through orjson when it is installed (`pip install orjson`, in the `bench` extra)
unless TICKLER_JSON=stdlib (config.Settings.json): the same JSON text, byte for byte (both compact, UTF-8 unescaped),
except that floats below 1e-4 spell their exponent 1e-7 where json writes 1e-07 (the same
number); a value orjson will not take (integers beyond 64 bits, non-string keys) goes through
the json module as before. Input stays on the json
module: orjson keeps the last of two equal keys without a word and reads integers beyond 64
bits as floats, both of which would change what tickler accepts.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from flask.json.provider import DefaultJSONProvider

from tickler.scheduler.strict_json import NotJSON, loads_strict

__all__ = ["NotJSON", "StrictJSONProvider", "loads_strict"]


def optional_orjson() -> ModuleType | None:
    try:
        import orjson
    except ImportError:
        return None
    return orjson


class StrictJSONProvider(DefaultJSONProvider):
    sort_keys = False
    compact = True
    ensure_ascii = False
    orjson: ModuleType | None = optional_orjson()

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads_strict(s)

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        # orjson writes what json.dumps(separators=(",", ":"), ensure_ascii=False) writes; dates and
        # dataclasses pass through to Flask's `default` (HTTP dates), as they do with json.
        if (
            self.orjson is not None
            and kwargs.get("separators", (",", ":")) == (",", ":")
            and set(kwargs) <= {"separators"}
        ):
            options = self.orjson.OPT_PASSTHROUGH_DATETIME | self.orjson.OPT_PASSTHROUGH_DATACLASS
            try:
                return str(self.orjson.dumps(obj, default=self.default, option=options).decode())
            except TypeError:  # orjson.JSONEncodeError: a value only json takes (or neither: same error)
                pass
        return super().dumps(obj, **kwargs)
