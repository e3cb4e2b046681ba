"""The dashboard's buttons: cancel, retry dead events, pause and resume a queue.

Each is a POST form with a CSRF token (checked before any of this runs, see session.py) that
calls the same store operation as the HTTP API, as the signed-in principal, then redirects back
(303) with a message: a refused operation is reported on the page, never as a 500. A bulk action
first shows a confirmation page (GET, changes nothing) that says how many events it will change.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, session, url_for
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from tickler.api import auth, context
from tickler.api.ui import bulk, format
from tickler.api.ui.session import safe_target, signed_in
from tickler.scheduler import rules
from tickler.scheduler.errors import TicklerError

DEFAULT_REASON = "cancelled from the dashboard"
MAX_REASON = 500
# A retry's delay, at most (the API's own bound is the event time rules').
MAX_DELAY_SECONDS = 366 * 86_400
# The session key of a refused retry's typed time (shown again by the key's page).
RETRY_TYPED = "retry_typed"


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/queues/<queue>/events/<item_key>/cancel", "cancel", cancel, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/cancel", "cancel_matching", cancel_matching, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/cancel", "confirm_cancel", confirm_cancel, methods=["GET"])
    bp.add_url_rule("/queues/<queue>/events/<item_key>/retry", "retry", retry, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/retry", "retry_matching", retry_matching, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/events/retry", "confirm_retry", confirm_retry, methods=["GET"])
    bp.add_url_rule("/queues/<queue>/pause", "pause", pause, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/resume", "resume", resume, methods=["POST"])


def back_to(queue: str) -> Response:
    """Where the form came from, if it is a page of this queue; else the queue's page."""
    target = safe_target(request.form.get("back", ""), under=f"/ui/queues/{queue}")
    return redirect(target or url_for("ui.queue", queue=queue), code=303)


def _reason() -> tuple[str, str | None]:
    """The typed reason of a cancel (the default when left empty), or why it is refused."""
    reason = " ".join(request.form.get("reason", "").split()) or DEFAULT_REASON
    if len(reason) > MAX_REASON:
        return reason, f"Reason: at most {MAX_REASON} characters."
    return reason, None


def cancel(queue: str, item_key: str) -> Response:
    reason, error = _reason()
    if error:
        auth.visible_queue(queue)
        flash(f"Not cancelled: {error}", "error")
        return back_to(queue)
    act = partial(context.store().events.cancel, queue, item_key, reason=reason)
    return _on_key(queue, act, refused="Not cancelled", done=f"Cancelled {item_key} ({reason}).")


def retry(queue: str, item_key: str) -> Response:
    when, error = _retry_time()
    if error:
        auth.visible_queue(queue)
        flash(f"Not retried: {error}", "error")
        # The key's page shows the form again with what was typed, to correct it.
        session[RETRY_TYPED] = {
            "queue": queue,
            "item_key": item_key,
            **{name: request.form.get(name, "").strip()[:100] for name in ("delay_seconds", "schedule_on")},
        }
        return back_to(queue)
    act = partial(context.store().events.retry, queue, item_key, **when)
    if "delay_seconds" in when:
        due = f"due in {when['delay_seconds']:g} s"
    elif "schedule_on" in when:
        due = f"due at {format.when(when['schedule_on'])}"
    else:
        due = "due now"
    return _on_key(
        queue, act, refused="Not retried", done=f"Retried {item_key}: it is {due}, with a fresh budget of attempts."
    )


def retry_typed(queue: str, item_key: str) -> dict[str, str]:
    """What a refused retry of this key typed (once: it is forgotten as it is read)."""
    typed = session.pop(RETRY_TYPED, None)
    if not isinstance(typed, dict) or typed.get("queue") != queue or typed.get("item_key") != item_key:
        return {}
    return {name: str(typed.get(name, "")) for name in ("delay_seconds", "schedule_on")}


def _retry_time() -> tuple[dict[str, Any], str | None]:
    """The retry form's `delay_seconds` or `schedule_on` (UTC; either, or neither: due now)."""
    delay = request.form.get("delay_seconds", "").strip()
    at = request.form.get("schedule_on", "").strip()
    if delay and at:
        return {}, "give a delay or a time, not both."
    if delay:
        try:
            seconds = float(delay)
        except ValueError:
            return {}, "the delay is a number of seconds."
        if not 0 <= seconds <= MAX_DELAY_SECONDS:
            return {}, f"the delay is 0 to {MAX_DELAY_SECONDS} seconds."
        return {"delay_seconds": seconds}, None
    if at:
        try:
            return {"schedule_on": rules.parse_rfc3339(at)}, None
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(at)
        except ValueError:
            return {}, "the time is a UTC time such as 2026-11-22T09:00."
        if parsed.tzinfo is not None:
            return {}, "a time with an offset needs the RFC 3339 form."
        return {"schedule_on": parsed.replace(tzinfo=UTC)}, None
    return {}, None


def _on_key(queue: str, act: Callable[..., object], *, refused: str, done: str) -> Response:
    """Act on one key as the signed-in principal; say what happened, or why it was refused."""
    auth.visible_queue(queue)
    try:
        act(actor=signed_in().name)
    except TicklerError as error:
        flash(f"{refused}: {error.detail}", "error")
    else:
        flash(done, "ok")
    return back_to(queue)


# -- bulk: a confirmation page that counts, then the POST that acts ----------------------------


def confirm_cancel(queue: str) -> tuple[str, int]:
    return _confirm(queue, bulk.CANCEL)


def confirm_retry(queue: str) -> tuple[str, int]:
    return _confirm(queue, bulk.RETRY)


def _confirm(queue: str, action: bulk.BulkAction) -> tuple[str, int]:
    auth.visible_queue(queue)
    plan = bulk.plan(queue, action, request.args)
    return render_template("ui/confirm_bulk.html", queue=queue, plan=plan), 400 if plan.refused else 200


def cancel_matching(queue: str) -> Response:
    reason, error = _reason()
    store = context.store()
    return _on_matching(
        queue,
        bulk.CANCEL,
        lambda matching, actor: store.events.cancel_matching(queue, matching, actor=actor, reason=reason),
        "Cancelled {n} pending event{s} (events in flight are left alone).",
        error,
    )


def retry_matching(queue: str) -> Response:
    store = context.store()
    return _on_matching(
        queue,
        bulk.RETRY,
        lambda matching, actor: store.events.retry_matching(queue, matching, actor=actor),
        "Retried {n} dead event{s}.",
        None,
    )


def _on_matching(
    queue: str, action: bulk.BulkAction, act: Callable[..., int], done: str, error: str | None
) -> Response:
    """Act on exactly the events the confirmed filters match; `done` says how many, as {n} event{s}."""
    auth.visible_queue(queue)
    plan = bulk.plan(queue, action, request.form, count=False)
    if plan.refused or error:
        flash(f"Nothing changed: {plan.refused or error}", "error")
    else:
        assert plan.matching is not None
        n = act(plan.matching, signed_in().name)
        flash(done.format(n=n, s="s" if n != 1 else ""), "ok")
    return redirect(plan.back, code=303)


# -- pause and resume ---------------------------------------------------------------------------


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
        queues.pause(queue, actor=signed_in().name)
        flash(f"Paused {queue}: nothing is delivered until it is resumed; scheduling goes on.", "ok")
    else:
        queues.resume(queue, actor=signed_in().name)
        flash(f"Resumed {queue}.", "ok")
    context.tickler().queues.forget(queue)  # this process sees the change at once
    return back_to(queue)
