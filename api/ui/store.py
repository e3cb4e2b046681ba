"""The dashboard's reader over this app's engine (one per app, made on first use)."""

from __future__ import annotations

from flask import current_app

from tickler.api import context
from tickler.scheduler.store.dashboard import DashboardStore


def dashboard() -> DashboardStore:
    found = current_app.extensions.get("tickler.dashboard")
    if found is None:
        found = current_app.extensions["tickler.dashboard"] = DashboardStore(context.store().engine)
    assert isinstance(found, DashboardStore)
    return found
