"""The API's JSON output is the same text whether orjson (when installed) or the json module writes it."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from flask import Flask

from tickler.api.jsonio import StrictJSONProvider

orjson = pytest.importorskip("orjson")


@dataclasses.dataclass
class Point:
    x: int
    label: str


VALUES: list[Any] = [
    {"item_key": "order-1", "data": {"n": 1, "price": 9.99, "tags": ["a", "b"]}, "next_cursor": None},
    {"unicode": 'é ü 中文 🎉 \u2028 \u0001 " \\ /', "empty": {}, "list": []},
    {"floats": [0.1, 1.0, 1e16, 1e-4, -0.0, 123456.789, 2.5e300], "ints": [0, -1, 2**63 - 1, -(2**63)]},
    {"big": 2**70},  # beyond orjson: the json module writes it
    {"when": datetime(2026, 11, 22, 21, 0, tzinfo=UTC), "day": date(2026, 1, 2)},
    {"decimal": Decimal("1.50"), "id": uuid.UUID("12345678-1234-5678-1234-567812345678")},
    {"point": Point(1, "p"), "nested": [[[{"deep": True}]]], "bools": [True, False]},
    [{"item_key": f"k{i}", "outcome": "created", "id": i} for i in range(1_000)],
    "just a string",
    42,
    None,
]


APP = Flask(__name__)  # providers hold their app weakly


def _providers() -> tuple[StrictJSONProvider, StrictJSONProvider]:
    app = APP
    fast, plain = StrictJSONProvider(app), StrictJSONProvider(app)
    fast.orjson, plain.orjson = orjson, None
    return fast, plain


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_orjson_and_json_write_the_same_text(value: Any) -> None:
    fast, plain = _providers()
    compact = {"separators": (",", ":")}
    assert fast.dumps(value, **compact) == plain.dumps(value, **compact)


def test_small_floats_differ_only_in_how_the_exponent_is_spelled() -> None:
    # json writes 1e-07, orjson 1e-7: the same number for every JSON reader
    fast, plain = _providers()
    value = {"tiny": [1e-7, 3.25e-12, -5e-300]}
    written = fast.dumps(value, separators=(",", ":"))
    assert written == '{"tiny":[1e-7,3.25e-12,-5e-300]}'
    assert json.loads(written) == json.loads(plain.dumps(value, separators=(",", ":"))) == value


def test_responses_are_the_same_bytes() -> None:
    fast, plain = _providers()
    body = {"events": [{"item_key": "é", "schedule_on": "2026-11-22T21:00:00Z", "data": {"x": [1, 2.5]}}]}
    with APP.app_context():
        assert fast.response(body).get_data() == plain.response(body).get_data()
        assert json.loads(fast.response(body).get_data()) == body


def test_a_value_neither_can_write_fails_the_same_way() -> None:
    fast, plain = _providers()
    for provider in (fast, plain):
        with pytest.raises(TypeError):
            provider.dumps({"x": object()}, separators=(",", ":"))
