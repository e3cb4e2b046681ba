"""The dashboard's readers over this app's engine (one of each per app, made on first use)."""

from __future__ import annotations

from typing import TypeVar

import sqlalchemy as sa
from flask import current_app

from tickler.api import context
from tickler.scheduler.store.audit import OperationsLog
from tickler.scheduler.store.base import EngineStore
from tickler.scheduler.store.dashboard import DashboardStore
from tickler.scheduler.store.ui_reads import UIReads
from tickler.scheduler.store.ui_sessions import SessionStore

S = TypeVar("S", bound=EngineStore)


def _per_app(kind: type[S]) -> S:
    key = f"tickler.ui.{kind.__name__}"
    found = current_app.extensions.get(key)
    if found is None:
        store = context.store()
        engine: sa.Engine = store.engine
        found = current_app.extensions[key] = kind(engine, store.reads)
    assert isinstance(found, kind)
    return found


def dashboard() -> DashboardStore:
    return _per_app(DashboardStore)


def sessions() -> SessionStore:
    return _per_app(SessionStore)


def reads() -> UIReads:
    return _per_app(UIReads)


def audit_log() -> OperationsLog:
    return _per_app(OperationsLog)
