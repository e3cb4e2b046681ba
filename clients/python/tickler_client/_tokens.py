"""Admin calls on API tokens: issue one (shown once), list them, revoke one. Each function
builds the call; the clients send it (see `_bind`)."""

from __future__ import annotations

from collections.abc import Iterable

from tickler_client._http import Answer, Call
from tickler_client._model import from_json
from tickler_client.models import Token


def _token(answer: Answer) -> Token:
    return from_json(Token, answer.body)


def create_token(name: str, *, queues: Iterable[str] = (), admin: bool = False) -> Call[Token]:
    """Issue a token for the principal `name`, scoped to `queues` (or every queue with
    `admin=True`); the answer's `token` is the secret, shown this once. Admin. Not retried: a
    repeat after a lost answer would issue a second token (list and revoke the stray one).

    >>> issued = admin.create_token("billing-service", queues=["invoices"])
    >>> billing = Client(url, issued.token)
    """
    body = {"name": name, "queues": list(queues), "admin": admin}
    return Call("POST", "/v1/tokens", _token, json=body)


def list_tokens() -> Call[list[Token]]:
    """Every token, revoked ones too (never their secrets). Admin. Retried.

    >>> [t.name for t in admin.list_tokens() if t.revoked_on is None]
    ['signup-service', 'billing-service']
    """
    return Call("GET", "/v1/tokens", lambda a: [from_json(Token, t) for t in a.body["tokens"]], safe=True)


def revoke_token(token_id: int) -> Call[Token]:
    """Revoke a token at once (its next request answers 401); returns it with `revoked_on` set.
    `NotFound` for an unknown id. Admin. Retried (revoking twice is revoking).

    >>> admin.revoke_token(issued.id).revoked_on
    datetime.datetime(2026, 11, 24, 3, 0, tzinfo=datetime.timezone.utc)
    """
    return Call("DELETE", f"/v1/tokens/{int(token_id)}", _token, safe=True)
