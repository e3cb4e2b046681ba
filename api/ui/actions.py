"""The dashboard's buttons: cancel, retry dead events, pause and resume a queue.

Each is a POST form with a CSRF token (checked before any of this runs, see session.py) that
calls the same store operation as the HTTP API, as the signed-in principal, then redirects back
(303) with a message: a refused operation is reported on the page, never as a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from flask import Blueprint, flash, redirect, request, url_for
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from tickler.api import auth, context
from tickler.api.ui.session import signed_in
from tickler.scheduler import rules
from tickler.scheduler.errors import TicklerError
from tickler.scheduler.store import Matching

_REASON = "cancelled from the dashboard"


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/queues/<queue>/events/<item_key>/cancel", "cancel", cancel, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/cancel", "cancel_matching", cancel_matching, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/<item_key>/retry", "retry", retry, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/retry", "retry_matching", retry_matching, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/pause", "pause", pause, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/resume", "resume", resume, methods=["POST"])


def _back(queue: str) -> Response:
    """Where the form came from, if it is a page of this queue; else the queue's page."""
    target = request.form.get("back", "")
    if target.startswith(f"/ui/queues/{queue}") and "\\" not in target and "//" not in target:
        return redirect(target, code=303)
    return redirect(url_for("ui.queue", queue=queue), code=303)


def _filter_fields() -> tuple[str | None, str | None, str | None]:
    """(group_key, item_key_prefix, error) of a by-filter form: at least one, each a valid key."""
    group_key = request.form.get("group_key", "").strip() or None
    prefix = request.form.get("item_key_prefix", "").strip() or None
    if group_key is None and prefix is None:
        return None, None, "Give a group key or a key prefix: a filter that matches everything is refused."
    if group_key is not None and rules.check_key(group_key):
        return None, None, f"Group key: {rules.check_key(group_key)}"
    if prefix is not None and len(prefix) > 255:
        return None, None, "Key prefix: at most 255 characters."
    return group_key, prefix, None


def cancel(queue: str, item_key: str) -> Response:
    act = partial(context.store().events.cancel, queue, item_key, reason=_REASON)
    return _on_key(queue, act, refused="Not cancelled", done=f"Cancelled {item_key}.")


def cancel_matching(queue: str) -> Response:
    act = partial(context.store().events.cancel_matching, queue, reason=_REASON)
    return _on_matching(queue, act, "Cancelled {n} open event{s} (events in flight are left alone).")


def retry(queue: str, item_key: str) -> Response:
    act = partial(context.store().events.retry, queue, item_key)
    return _on_key(
        queue, act, refused="Not retried", done=f"Retried {item_key}: it is due now, with a fresh budget of attempts."
    )


def retry_matching(queue: str) -> Response:
    act = partial(context.store().events.retry_matching, queue)
    return _on_matching(queue, act, "Retried {n} dead event{s}.")


def _on_key(queue: str, act: Callable[..., object], *, refused: str, done: str) -> Response:
    """Act on one key as the signed-in principal; say what happened, or why it was refused."""
    auth.visible_queue(queue)
    try:
        act(actor=signed_in().name)
    except TicklerError as error:
        flash(f"{refused}: {error.detail}", "error")
    else:
        flash(done, "ok")
    return _back(queue)


def _on_matching(queue: str, act: Callable[..., int], done: str) -> Response:
    """Act on the events the form's filter matches (group_key and/or item_key_prefix); `done`
    says how many, as {n} event{s}."""
    auth.visible_queue(queue)
    group_key, prefix, error = _filter_fields()
    if error:
        flash(error, "error")
    else:
        n = act(Matching(group_key, prefix), actor=signed_in().name)
        flash(done.format(n=n, s="s" if n != 1 else ""), "ok")
    return _back(queue)


def pause(queue: str) -> Response:
    return _set_paused(queue, paused=True)


def resume(queue: str) -> Response:
    return _set_paused(queue, paused=False)


def _set_paused(queue: str, *, paused: bool) -> Response:
    auth.visible_queue(queue)
    if not signed_in().is_admin:
        raise Forbidden("Pausing and resuming a queue needs an admin token.")
    queues = context.store().queues
    if paused:
        queues.pause(queue)
        flash(f"Paused {queue}: nothing is delivered until it is resumed; scheduling goes on.", "ok")
    else:
        queues.resume(queue)
        flash(f"Resumed {queue}.", "ok")
    context.tickler().queues.forget(queue)  # this process sees the change at once
    return _back(queue)
