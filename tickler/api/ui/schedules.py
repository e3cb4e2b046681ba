"""The Schedules page of a queue: its recurring schedules with their next occurrences, and the
buttons to pause, resume and delete one (queue access, as for the API's schedules)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from tickler.api import auth, context
from tickler.api.ui.session import signed_in
from tickler.scheduler import rules
from tickler.scheduler.errors import NotFound, TicklerError
from tickler.scheduler.store import ScheduleSpec

PAGE_SIZE = 100


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/queues/<queue>/schedules", "schedules", schedules_page)
    bp.add_url_rule("/queues/<queue>/schedules/<schedule_key>/pause", "pause_schedule", pause, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/schedules/<schedule_key>/resume", "resume_schedule", resume, methods=["POST"])
    bp.add_url_rule("/queues/<queue>/schedules/<schedule_key>/delete", "delete_schedule", delete, methods=["POST"])


def schedules_page(queue: str) -> str:
    found = auth.visible_queue(queue)
    after = request.args.get("after", "").strip() or None
    if after is not None and rules.check_key(after):
        raise NotFound("Not a page of this queue's schedules.")
    listed = context.store().schedules.list(queue, after=after, limit=PAGE_SIZE + 1)
    shown = listed[:PAGE_SIZE]
    next_url = None
    if len(listed) > PAGE_SIZE:
        next_url = url_for("ui.schedules", queue=queue, after=shown[-1].schedule_key)
    return render_template(
        "ui/schedules.html",
        queue=found,
        schedules=shown,
        next_url=next_url,
        first_page=after is None,
        now=datetime.now(UTC),
    )


def pause(queue: str, schedule_key: str) -> Response:
    return _set_paused(queue, schedule_key, paused=True)


def resume(queue: str, schedule_key: str) -> Response:
    return _set_paused(queue, schedule_key, paused=False)


def _set_paused(queue: str, schedule_key: str, *, paused: bool) -> Response:
    auth.visible_queue(queue)
    store = context.store().schedules
    try:
        current = store.get(queue, schedule_key)
        fields = {f.name: getattr(current, f.name) for f in dataclasses.fields(ScheduleSpec) if f.name != "paused"}
        store.put(queue, schedule_key, ScheduleSpec(**fields, paused=paused), actor=signed_in().name)
    except TicklerError as error:
        flash(f"Not {'paused' if paused else 'resumed'}: {error.detail}", "error")
    else:
        done = "nothing is enqueued until it is resumed" if paused else "its next occurrence is enqueued"
        flash(f"{'Paused' if paused else 'Resumed'} schedule {schedule_key}: {done}.", "ok")
    return _back(queue)


def delete(queue: str, schedule_key: str) -> Response:
    auth.visible_queue(queue)
    try:
        context.store().schedules.delete(queue, schedule_key, actor=signed_in().name)
    except TicklerError as error:
        flash(f"Not deleted: {error.detail}", "error")
    else:
        flash(f"Deleted schedule {schedule_key}; its waiting occurrence was cancelled.", "ok")
    return _back(queue)


def _back(queue: str) -> Response:
    return redirect(url_for("ui.schedules", queue=queue), code=303)
