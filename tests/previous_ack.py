"""The ack of the release before migration 0072 (tests/previous_ack.sql, frozen): it writes each
delivery's `delivered` timeline row itself. The upgrade tests run it on databases older than
0072 (no history entry_id for this release's ack); tests/test_delivered_entry.py compares the
entries it wrote with the ones this release's ack leaves in history."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from tickler.scheduler.sql import parse_queries

ACK_BEFORE_0072 = sa.text(parse_queries((Path(__file__).parent / "previous_ack.sql").read_text())["ack_leases"])


def ack_before_0072(engine: sa.Engine, lease_ids: list[str], *, now: datetime | None = None) -> list[str]:
    """The leases finished by the ack of the release before 0072: it writes each delivery's
    timeline row."""
    params = {"lease_ids": lease_ids, "queues": None, "now": now, "trace_ids": None}
    with engine.begin() as conn:
        return [str(row[0]) for row in conn.execute(ACK_BEFORE_0072, params)]
