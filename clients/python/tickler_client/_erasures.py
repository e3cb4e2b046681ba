"""Admin calls on erasures (erasing a subject: every event of a group, keys or a key prefix, open
or finished, and their timelines): request one, follow it, and ask whether a value was erased.
Each function builds the call; the clients send it (see `_bind`)."""

from __future__ import annotations

from collections.abc import Iterable

from tickler_client._http import Answer, Call
from tickler_client._model import from_json
from tickler_client.errors import ValidationError
from tickler_client.models import Erasure


def _erasure(answer: Answer) -> Erasure:
    return from_json(Erasure, answer.body)


def erase(
    *,
    reason: str,
    group_key: str | None = None,
    item_keys: Iterable[str] | None = None,
    item_key_prefix: str | None = None,
    queues: Iterable[str] | None = None,
) -> Call[Erasure]:
    """Erase a subject: every event whose group is `group_key`, whose key is one of `item_keys`
    or starts with `item_key_prefix` (any of them), in `queues` (default: every queue), with
    their timelines. Returns the erasure, `pending`: the server's dispatcher runs it (follow it
    with `erasure(id)`). Admin. Not retried: a repeat after a lost answer logs a second erasure,
    which finds nothing left and changes nothing.

    >>> admin.erase(group_key="ana@example.com", reason="ticket 4711").status
    'pending'
    """
    if group_key is None and item_keys is None and item_key_prefix is None:
        message = "Give group_key, item_keys and/or item_key_prefix."
        raise ValidationError(
            message, errors={"group_key": [message], "item_keys": [message], "item_key_prefix": [message]}
        )
    body: dict[str, object] = {"reason": reason}
    if group_key is not None:
        body["group_key"] = group_key
    if item_keys is not None:
        body["item_keys"] = list(item_keys)
    if item_key_prefix is not None:
        body["item_key_prefix"] = item_key_prefix
    if queues is not None:
        body["queues"] = list(queues)
    return Call("POST", "/v1/erasures", _erasure, json=body)


def erasure(erasure_id: int) -> Call[Erasure]:
    """An erasure and its progress (`status`: pending, running, done or failed; `counts`).
    `NotFound` for an unknown id. Admin. Retried.

    >>> admin.erasure(7).counts["finished_events"]
    12
    """
    return Call("GET", f"/v1/erasures/{int(erasure_id)}", _erasure, safe=True)


def erasures(*, item_key: str | None = None, group_key: str | None = None) -> Call[list[Erasure]]:
    """The erasures that erased this item key or this group (one of the two), oldest first: the
    server compares keyed hashes and never kept the value. Admin. Retried.

    >>> [e.id for e in admin.erasures(item_key="welcome:ana@example.com")]
    [7]
    """
    if (item_key is None) == (group_key is None):
        message = "Give item_key or group_key (one of them)."
        raise ValidationError(message, errors={"item_key": [message], "group_key": [message]})
    params = {"item_key": item_key} if item_key is not None else {"group_key": str(group_key)}
    return Call(
        "GET", "/v1/erasures", lambda a: [from_json(Erasure, e) for e in a.body["erasures"]], params=params, safe=True
    )
