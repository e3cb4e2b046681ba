"""Erasures on the dashboard (admins only, SPEC §12): erase a key from its page, behind a
confirmation that counts what it will change, and the list of erasures with their progress.
The erasure is requested as POST /v1/erasures requests it; the dispatcher runs it."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from tickler.api import context
from tickler.api.ui.session import signed_in
from tickler.scheduler import erasing, rules
from tickler.scheduler.errors import Invalid, NotFound
from tickler.scheduler.store.erasures import ErasureStore, Selector


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/erasures", "erasures", erasures_page)
    bp.add_url_rule("/queues/<queue>/events/<item_key>/erase", "confirm_erase", confirm_erase)
    bp.add_url_rule("/queues/<queue>/events/<item_key>/erase", "erase", erase, methods=["POST"])


def _require_admin() -> None:
    if not signed_in().is_admin:
        raise Forbidden("Erasing needs an admin token.")


def _store() -> ErasureStore:
    return ErasureStore(context.store().engine)


def erasures_page() -> str:
    _require_admin()
    return render_template("ui/erasures.html", erasures=_store().recent())


def _checked(queue: str, item_key: str) -> None:
    problem = rules.check_queue_name(queue) or rules.check_item_key(item_key)
    if problem:
        raise NotFound(problem)
    context.store().queues.get(queue)  # NotFound for a queue that does not exist


def confirm_erase(queue: str, item_key: str, *, error: str | None = None) -> str:
    _require_admin()
    _checked(queue, item_key)
    impact = _store().impact(queue, item_key)
    return render_template("ui/confirm_erase.html", queue=queue, item_key=item_key, impact=impact, error=error)


def erase(queue: str, item_key: str) -> Response | tuple[str, int]:
    _require_admin()
    _checked(queue, item_key)
    reason = request.form.get("reason", "").strip()
    problem = rules.check_text(reason, 1000) if reason else "Give a reason: it is kept in the erasure log."
    if problem:
        return confirm_erase(queue, item_key, error=problem), 400
    try:
        erasure = erasing.request(
            context.store().engine,
            Selector(item_keys=(item_key,), queues=(queue,)),
            reason=reason,
            requested_by=signed_in().name,
            secret=context.tickler().settings.secret_key,
        )
    except Invalid as refused:
        return confirm_erase(queue, item_key, error=refused.detail), 400
    flash(f"Erasure {erasure.id} requested: the dispatcher erases the key within seconds.", "ok")
    return redirect(url_for("ui.erasures"), code=303)
