"""The erasure log (SPEC §12): erasures requested, read and looked up by keyed hash, and the steps
their runner (scheduler/erasing.py) takes. The log holds hashes, never the erased values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tickler.scheduler.db import driver_connection
from tickler.scheduler.sql import driver_sql, run
from tickler.scheduler.store import audit
from tickler.scheduler.store.base import EngineStore
from tickler.scheduler.store.search import prefix_end

# A range [from, to) of dequeued_on in the walk through history.
Walk = tuple[datetime, datetime]


@dataclass(frozen=True)
class Selector:
    """What an erasure erases, in clear: the events of this group, these keys or keys with this
    prefix (any of them), in these queues (None: every queue)."""

    group_key: str | None = None
    item_keys: tuple[str, ...] | None = None
    item_key_prefix: str | None = None
    queues: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Erasure:
    """One erasure as the log keeps it."""

    id: int
    status: str
    requested_by: str
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    reason: str
    queues: tuple[str, ...] | None
    open_events: int
    finished_events: int
    timeline_entries: int
    archive_rows: int
    note: str | None


@dataclass(frozen=True)
class Impact:
    """What an erasure of one key would change, counted before it is asked."""

    open_events: int
    finished_events: int
    timeline_entries: int


def _erasure(row: Mapping[str, Any]) -> Erasure:
    # The log's columns are named as the fields; only `queues` (an array) changes type.
    found = {name: row[name] for name in Erasure.__dataclass_fields__}
    return Erasure(**{**found, "queues": None if row["queues"] is None else tuple(row["queues"])})


class ErasureStore(EngineStore):
    def request(self, selector: Selector, *, reason: str, requested_by: str, hashes: Mapping[str, str]) -> Erasure:
        """Log a pending erasure: `hashes` maps each selector value to its keyed hash (the log's).
        The operations log records the request in the same transaction: the erasure's id, reason
        and queues, never the values."""
        keys = selector.item_keys
        prefix = selector.item_key_prefix
        params = {
            "requested_by": requested_by,
            "reason": reason,
            "queues": None if selector.queues is None else sorted(set(selector.queues)),
            "group_key_hash": None if selector.group_key is None else hashes[selector.group_key],
            "item_key_hashes": None if keys is None else [hashes[key] for key in keys],
            "item_key_prefix_hash": None if prefix is None else hashes[prefix],
            "group_key": selector.group_key,
            "item_keys": None if keys is None else list(keys),
            "item_key_prefix": prefix,
            "item_key_prefix_end": None if prefix is None else prefix_end(prefix),
        }
        with driver_connection(self.engine, driver_sql("request_erasure"), params) as conn:
            [row] = run(conn, driver_sql("request_erasure"), params)
            erasure = _erasure(row)
            audit.OperationsLog.record(
                conn,
                actor=requested_by,
                action=audit.ERASURE_REQUESTED,
                after={"erasure_id": erasure.id, "reason": reason, "queues": params["queues"]},
            )
        return erasure

    def get(self, erasure_id: int) -> Erasure | None:
        rows = self.rows("get_erasure", {"id": erasure_id})
        return _erasure(rows[0]) if rows else None

    def by_hash(self, kind: str, value_hash: str) -> list[Erasure]:
        """The erasures that erased the value with this keyed hash (`kind`: item_key or group_key)."""
        return [_erasure(row) for row in self.rows("erasures_by_hash", {"kind": kind, "value_hash": value_hash})]

    def recent(self, limit: int = 100) -> list[Erasure]:
        return [_erasure(row) for row in self.rows("recent_erasures", {"limit": limit})]

    def impact(self, queue: str, item_key: str) -> Impact:
        """What erasing `item_key` of `queue` would change now (the dashboard's confirmation)."""
        [row] = self.rows("erasure_impact", {"queue": queue, "item_key": item_key})
        return Impact(
            open_events=row["open_events"],
            finished_events=row["events"] - row["open_events"],
            timeline_entries=row["timeline_entries"],
        )

    def unfinished(self) -> list[int]:
        return [row["id"] for row in self.rows("unfinished_erasures")]

    # -- the runner's steps, each its own transaction -------------------------------------------

    def now(self) -> datetime:
        [row] = self.rows("database_now")
        return row["now"]  # type: ignore[no-any-return]

    def values(self, erasure_id: int, limit: int, walk: Walk | None = None) -> list[str]:
        """The values of the next batch's rows: open events, else finished events of the walk's
        range, or with no range (the walk is over) keys only the timeline holds."""
        params = {"id": erasure_id, "limit": limit, "from": walk and walk[0], "to": walk and walk[1]}
        return [row["value"] for row in self.rows("erasure_values", params)]

    def erase_batch(self, erasure_id: int, hashes: Mapping[str, str], limit: int, walk: Walk | None = None) -> int:
        params = {"id": erasure_id, "hashes": json.dumps(dict(hashes)), "limit": limit}
        [row] = self.rows("erase_batch", {**params, "from": walk and walk[0], "to": walk and walk[1]})
        return int(row["erased"])

    def schedule_values(self, erasure_id: int) -> list[str]:
        """The keys and groups of the recurring schedules the erasure matches, to be hashed."""
        return [row["value"] for row in self.rows("erasure_schedule_values", {"id": erasure_id})]

    def erase_schedules(self, erasure_id: int, hashes: Mapping[str, str]) -> int:
        """Delete the matching schedules and erase their keys' timelines; returns how many."""
        [row] = self.rows("erase_schedules", {"id": erasure_id, "hashes": json.dumps(dict(hashes))})
        return int(row["erased"])

    def walk(self, erasure_id: int) -> tuple[datetime | None, datetime | None, datetime] | None:
        """(where the walk through history resumes or None, the oldest day of history, now);
        None: the erasure has no work left."""
        rows = self.rows("erasure_walk", {"id": erasure_id})
        return (rows[0]["walked_to"], rows[0]["oldest_day"], rows[0]["now"]) if rows else None

    def walked(self, erasure_id: int, to: datetime) -> None:
        self.rows("erasure_walked", {"id": erasure_id, "to": to})

    def finish(self, erasure_id: int, since: datetime, note: str | None, lease_margin: float) -> str:
        """'done', 'rows_left' or 'leases_held' (tickler_erasure_finish)."""
        params = {"id": erasure_id, "since": since, "note": note, "lease_margin": lease_margin}
        [row] = self.rows("finish_erasure", params)
        return str(row["finished"])

    def fail(self, erasure_id: int, note: str) -> None:
        self.rows("fail_erasure", {"id": erasure_id, "note": note})
