"""A queue's settings page: every setting the API shows, rendered generically (a setting added to
the queue's JSON and to PUT /v1/queues later shows up here by itself); admins can edit the ones
PUT takes. The webhook signing secret is never shown (GET /v1/queues/{q}/signing-secret is the
one, audited, way to read it).

The form is turned into the PUT body the API would take (only the settings that changed, each
typed by its field in PutQueueSchema), loaded by that same schema and stored by the same call, so
the page refuses exactly what the API refuses, with the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from marshmallow import Schema, ValidationError, fields, validate
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from tickler.api import auth, context
from tickler.api.queues import wanted_settings
from tickler.api.render import queue_json
from tickler.api.schemas.queues import PutQueueSchema
from tickler.scheduler.errors import Invalid

_schema = PutQueueSchema()
# Shown, never edited here: what identifies the queue, its state, and its own clock.
_READ_ONLY = ("name", "paused", "created_on", "updated_on")
# Actions rather than settings (rotating the secret would have to show the new one).
_NOT_SETTINGS = frozenset({"rotate_signing_secret"})


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/queues/<queue>/settings", "settings", settings_page)
    bp.add_url_rule("/queues/<queue>/settings", "save_settings", save_settings, methods=["POST"])


@dataclass(frozen=True)
class Setting:
    path: str  # "delivery.url"
    value: Any
    kind: str  # "number", "integer", "boolean", "text"
    editable: bool
    nullable: bool
    help: str
    choices: tuple[str, ...] = ()  # a field that takes one of these (a select)


def settings_page(queue: str) -> str:
    found = auth.visible_queue(queue)
    return render_template("ui/settings.html", queue=found, settings=_settings(queue), errors={}, typed={})


def save_settings(queue: str) -> tuple[str, int] | Response:
    auth.visible_queue(queue)
    if not auth.principal().is_admin:
        raise Forbidden("Changing a queue's settings needs an admin token.")
    shown = _settings(queue)
    # A field the form did not send is left as it is (as PUT leaves out what it is not given).
    typed = {
        s.path: request.form[f"setting:{s.path}"] for s in shown if s.editable and f"setting:{s.path}" in request.form
    }
    body, errors = _body(shown, typed)
    if body:
        # Checked by the API's schema even when some field did not parse: every invalid field
        # is reported at once, not the first alone.
        try:
            loaded = _schema.load(body)
        except ValidationError as error:
            errors = {**_flatten(error.messages), **errors}
        else:
            if not errors:
                errors = _store(queue, loaded)
    if errors:
        found = auth.visible_queue(queue)
        return render_template("ui/settings.html", queue=found, settings=shown, errors=errors, typed=typed), 400
    flash(f"Saved the settings of {queue}." if body else "Nothing changed.", "ok")
    return redirect(url_for("ui.settings", queue=queue), code=303)


def _store(queue: str, loaded: dict[str, Any]) -> dict[str, str]:
    """Store the loaded settings; what the store refused, by field (nothing: stored)."""
    ext = context.tickler()
    try:
        ext.store.queues.put(queue, wanted_settings(loaded), ext.settings)
    except Invalid as error:
        found_errors = error.extra.get("errors") or {}
        errors = {path: " ".join(messages) for path, messages in found_errors.items()}
        return errors or {"settings": error.detail}
    ext.queues.forget(queue)
    return {}


def _settings(queue: str) -> list[Setting]:
    """Every setting of the queue's JSON (secret never), and those PUT takes that it leaves out
    (a pull queue's webhook url), flattened to dotted paths."""
    current = queue_json(context.store().queues.get(queue))
    current.pop("signing_secret", None)
    shown: list[Setting] = []
    for name in _READ_ONLY:
        if name in current:
            shown.append(Setting(name, current.pop(name), "text", False, False, ""))
    for name, field in _schema.fields.items():
        if name in _NOT_SETTINGS:
            continue
        value = current.pop(name, None)
        if isinstance(field, fields.Nested) and isinstance(field.schema, Schema):
            inner = value if isinstance(value, dict) else {}
            for sub, sub_field in field.schema.fields.items():
                shown.append(_setting(f"{name}.{sub}", inner.get(sub), sub_field))
        else:
            shown.append(_setting(name, value, field))
    # Anything else the JSON carries (a setting PUT does not take): shown, read-only.
    shown.extend(Setting(name, value, "text", False, False, "") for name, value in current.items())
    return shown


def _setting(path: str, value: Any, field: fields.Field) -> Setting:  # type: ignore[type-arg]
    if isinstance(field, fields.Boolean):
        kind = "boolean"
    elif isinstance(field, fields.Integer):
        kind = "integer"
    elif isinstance(field, fields.Number):
        kind = "number"
    else:
        kind = "text"
    help_text = str(field.metadata.get("description", ""))
    validators = field.validators if isinstance(field.validators, list) else []
    choices = next((tuple(map(str, v.choices)) for v in validators if isinstance(v, validate.OneOf)), ())
    return Setting(path, value, kind, True, bool(field.allow_none), help_text, choices)


def _body(shown: list[Setting], typed: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The PUT body of the settings that changed: a nested object is sent whole (its fields as
    typed) when any of its fields changed; an empty field is null (no limit) or left out."""
    body: dict[str, Any] = {}
    errors: dict[str, str] = {}
    changed_groups: set[str] = set()
    values: dict[str, Any] = {}
    for setting in shown:
        if not setting.editable or setting.path not in typed:
            continue
        raw = typed[setting.path].strip()
        try:
            value = _parse(raw, setting)
        except ValueError as error:
            errors[setting.path] = str(error)
            continue
        values[setting.path] = value
        if value != setting.value:
            head, dot, _ = setting.path.partition(".")
            if dot:
                changed_groups.add(head)
            else:
                body[setting.path] = value
    for path, value in values.items():
        head, dot, tail = path.partition(".")
        if dot and head in changed_groups and value is not None:
            body.setdefault(head, {})[tail] = value
    return body, errors


def _parse(raw: str, setting: Setting) -> Any:
    if raw == "":
        return None
    if setting.kind == "boolean":
        if raw not in ("true", "false"):
            raise ValueError("Choose yes or no.")
        return raw == "true"
    if setting.kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ValueError("A whole number.") from None
    if setting.kind == "number":
        try:
            number = float(raw)
        except ValueError:
            raise ValueError("A number.") from None
        return int(number) if number.is_integer() and isinstance(setting.value, int) else number
    return raw


def _flatten(messages: Any, prefix: str = "") -> dict[str, str]:
    """marshmallow's nested messages as {"delivery.url": "…"}."""
    if isinstance(messages, dict):
        flat: dict[str, str] = {}
        for key, value in messages.items():
            flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        return {prefix or "settings": " ".join(messages)}
    return {prefix or "settings": str(messages)}
