"""The answer models as field tables: each field says how it is read from the JSON key of its name,
and one reader builds any model from an answer (so no model has a hand-written parser)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, dataclass_transform

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

M = TypeVar("M", bound="DataclassInstance")
T = TypeVar("T")

REQUIRED: Any = object()  # `missing=REQUIRED`: an answer without the key is an error (KeyError)


def _same(value: Any) -> Any:
    return value


def wire(read: Callable[[Any], Any] = _same, *, missing: Any = REQUIRED, default: Any = dataclasses.MISSING) -> Any:
    """A model field read as `read(answer[name])`; `missing` stands for a key the answer lacks.
    `default` is the field's default when the model is built by hand."""
    return dataclasses.field(default=default, metadata={"read": read, "missing": missing})


@dataclass_transform(frozen_default=True, field_specifiers=(wire, dataclasses.field))
def model(cls: type[T]) -> type[T]:
    """A frozen dataclass whose fields are declared with `wire`."""
    return dataclasses.dataclass(frozen=True)(cls)


def from_json(cls: type[M], body: dict[str, Any], **given: Any) -> M:
    """`cls` read from an answer: every `wire` field not in `given`, and `raw` (the answer itself)
    where the model keeps it."""
    values = dict(given)
    for f in dataclasses.fields(cls):
        if f.name in values:
            continue
        if f.name == "raw":
            values["raw"] = body
        elif "read" in f.metadata:
            missing = f.metadata["missing"]
            values[f.name] = f.metadata["read"](body[f.name] if missing is REQUIRED else body.get(f.name, missing))
    return cls(**values)
