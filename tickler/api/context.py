"""What a view needs from the app and the request: the store, the settings, the JSON body and the
query string. Who the caller is and what it may see: api.auth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flask import current_app, request

from tickler.api.cache import TTLCache
from tickler.api.jsonio import NotJSON, loads_strict
from tickler.api.token_use import TokenUse
from tickler.config import Settings
from tickler.scheduler.errors import Invalid
from tickler.scheduler.models import Principal, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.wakeup import SETTINGS_CHANGED, UNKNOWN, WakeupListener


@dataclass
class Tickler:
    """tickler's state inside one Flask app (one per process)."""

    settings: Settings
    store: Store
    database_url: str
    principals: TTLCache[Principal] = field(init=False)
    queues: TTLCache[Queue] = field(init=False)
    token_use: TokenUse = field(init=False)

    def __post_init__(self) -> None:
        self.token_use = TokenUse(self.store.tokens)
        self.principals = TTLCache(self.settings.cache_seconds)
        self.queues = TTLCache(self.settings.cache_seconds)

    def follow(self, listener: WakeupListener) -> None:
        """Drop cache entries when any process revokes a token or changes a queue (NOTIFY), and
        cache nothing while the LISTEN connection is down (a drop could be missed)."""
        self.principals.trusted = self.queues.trusted = listener.connected.is_set
        listener.subscribe(self._changed)

    def _changed(self, payload: str) -> None:
        if payload == UNKNOWN:
            self.principals.clear()
            self.queues.clear()
        elif payload.startswith(SETTINGS_CHANGED):
            self.queues.forget(payload.removeprefix(SETTINGS_CHANGED))
        elif payload.startswith("token:"):
            try:
                self.principals.forget(bytes.fromhex(payload.removeprefix("token:")))
            except ValueError:
                self.principals.clear()


def tickler() -> Tickler:
    ext: Tickler = current_app.extensions["tickler"]
    return ext


def store() -> Store:
    return tickler().store


def json_body() -> dict[str, Any]:
    """The request body as a JSON object (400 when it is not one; 413 past the size limit)."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        raise Invalid("A JSON body is required.", errors={"body": ["A JSON object is required."]})
    try:
        body = loads_strict(raw)
    except NotJSON as error:
        raise Invalid("The body is not valid JSON.", errors={"body": [f"Not valid JSON: {error}."]}) from None
    if not isinstance(body, dict):
        raise Invalid("The body must be a JSON object.", errors={"body": ["Must be a JSON object."]})
    return body


View = TypeVar("View", bound=Callable[..., Any])


def takes_query_args(view: View) -> View:
    """Marks a write view that reads query parameters itself (with a schema that refuses the
    unknown ones); every other write view refuses any (refuse_query_args)."""
    view.takes_query_args = True  # type: ignore[attr-defined]
    return view


def refuse_query_args() -> None:
    """before_request of /v1: unknown fields are errors (SPEC), in the query string too. Reads
    validate their own parameters; a write that takes none answers 400 naming each one given,
    before it changes anything."""
    if request.method in ("GET", "HEAD", "OPTIONS") or not request.args:
        return
    view = current_app.view_functions.get(request.endpoint or "")
    if view is None or getattr(view, "takes_query_args", False):
        return
    raise Invalid("This call takes no query parameters.", errors={name: ["Unknown field."] for name in request.args})


def query_args() -> dict[str, str]:
    """Query parameters, each given at most once."""
    args: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    for key, values in request.args.lists():
        if len(values) > 1:
            repeated[key] = ["Give this parameter once."]
        args[key] = values[-1]
    if repeated:
        raise Invalid("A query parameter was repeated.", errors=repeated)
    return args
