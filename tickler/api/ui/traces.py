"""Links from the dashboard to a tracing UI (SPEC §11): a timeline entry of a traced attempt
keeps its trace id, and TICKLER_TRACE_URL_TEMPLATE (e.g. Jaeger's
`http://jaeger:16686/trace/{trace_id}`, or a Grafana Tempo explore URL) turns it into a link."""

from __future__ import annotations

import os
import re

from flask import Blueprint, Flask, current_app

VARIABLE = "TICKLER_TRACE_URL_TEMPLATE"
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def configure(app: Flask) -> None:
    """Read the template (from the app's config, else the environment); only http(s) URLs."""
    template = app.config.get(VARIABLE) or os.environ.get(VARIABLE, "")
    app.config[VARIABLE] = template if template.startswith(("http://", "https://")) else ""


def trace_url(trace_id: object) -> str | None:
    """The tracing UI's page of this trace; None without a template or for anything but a trace id."""
    template = current_app.config.get(VARIABLE)
    if not template or not isinstance(trace_id, str) or _TRACE_ID.fullmatch(trace_id) is None:
        return None
    return str(template).replace("{trace_id}", trace_id)


def install(bp: Blueprint) -> None:
    bp.add_app_template_global(trace_url, "trace_url")
