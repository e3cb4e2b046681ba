"""The Python client's erasure calls (SPEC §12) against the real server, with `Client` and
`AsyncClient`: request an erasure, follow it to done, look a value up; refusals as typed errors."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from tickler_client import Client, Erasure, Forbidden, NotFound, ValidationError

from tickler.scheduler.erasing import Eraser, Hasher

EMAIL = "zqxclient@example.com"


def test_erase_follow_and_look_up(admin: Client, tickler: Client, engine: sa.Engine) -> None:
    tickler.schedule("emails", f"welcome:{EMAIL}", {"to": EMAIL}, group_key=EMAIL)
    erasure = admin.erase(group_key=EMAIL, queues=["emails"], reason="asked by the subject")
    assert isinstance(erasure, Erasure)
    assert erasure.status == "pending" and erasure.requested_by == "ops" and erasure.queues == ["emails"]
    Eraser(engine, Hasher(engine)).run_unfinished()  # what the dispatcher does
    done = admin.erasure(erasure.id)
    assert done.status == "done" and done.finished_at is not None
    assert done.counts["open_events"] == 1 and done.counts["archive_rows"] == 0
    assert [e.id for e in admin.erasures(item_key=f"welcome:{EMAIL}")] == [erasure.id]
    assert [e.id for e in admin.erasures(group_key=EMAIL)] == [erasure.id]
    with pytest.raises(NotFound):
        tickler.get("emails", f"welcome:{EMAIL}")


def test_refusals_are_typed(admin: Client, tickler: Client) -> None:
    with pytest.raises(ValidationError) as no_selector:
        admin.erase(reason="r")
    assert no_selector.value.status == 0 and "group_key" in no_selector.value.errors  # refused before sending
    with pytest.raises(ValidationError) as short:
        admin.erase(item_key_prefix="ab", reason="r")
    assert "item_key_prefix" in short.value.errors
    with pytest.raises(ValidationError) as unknown:
        admin.erase(group_key="g", queues=["nope"], reason="r")
    assert "queues" in unknown.value.errors
    with pytest.raises(Forbidden):
        tickler.erase(group_key="g", reason="r")
    with pytest.raises(NotFound):
        admin.erasure(999_999)
    with pytest.raises(ValidationError):
        admin.erasures()
