"""The single-event branch of tickler_schedule_write() (migration 0064) against the general path.

The same steps run on two queues: one through tickler_schedule() as migrated (one event per call:
the single-event branch), the other through 0061's tickler_schedule_write() with 0014's and 0040's
wrappers, copied under names of their own. Results, events (versions, times, lease ends), timeline
entries, counts and errors must be the same, for every on_conflict mode, debounce with and without
a cap, groups, priority and fairness keys, traced calls, refused items (conflict, ignored, in
flight) and an expired lease the call ends first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tickler.scheduler.models import Queue

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "migrations"
T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
SINGLE, GENERAL = "single_path", "general_path"
LEASE_COLUMNS = ("lease_id",)


def function_text(migration: str, header: str) -> str:
    """One CREATE FUNCTION statement of a migration, from its header to the end of its body."""
    text = (MIGRATIONS / migration).read_text()
    start = text.index(header)
    body = text.index("$$", text.index("$$", start) + 2)
    return text[start : body + 3]


def general_copies() -> list[str]:
    """0061's write function, 0014's tickler_schedule and 0040's traced wrapper, named *_general."""
    sources = [
        ("0061_timeline_one_place.sql", "CREATE OR REPLACE FUNCTION tickler_schedule_write("),
        ("0014_expired_leases.sql", "CREATE FUNCTION tickler_schedule("),
        ("0040_trace_context.sql", "CREATE FUNCTION tickler_schedule_traced("),
    ]
    copies = []
    for migration, header in sources:
        text = function_text(migration, header).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        copies.append(re.sub(r"\btickler_schedule(_write|_traced)?\(", r"tickler_schedule\1_general(", text))
    return copies


@pytest.fixture
def general(raw: psycopg.Connection[Any]) -> Iterator[None]:
    for statement in general_copies():
        raw.execute(statement)  # type: ignore[arg-type]
    yield
    for name in ("tickler_schedule_traced_general", "tickler_schedule_general", "tickler_schedule_write_general"):
        raw.execute(f"DROP FUNCTION {name}")  # type: ignore[arg-type]


class Side:
    """One queue and the functions that write it; ids are numbered in the order they are first seen."""

    def __init__(self, raw: psycopg.Connection[Any], queue: str, suffix: str) -> None:
        self.raw, self.queue, self.suffix = raw, queue, suffix
        self.ids: dict[int, int] = {}

    def id(self, value: int | None) -> int | None:
        return None if value is None else self.ids.setdefault(value, len(self.ids) + 1)

    def event(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        event = dict(row)
        event["id"] = self.id(event["id"])
        event.pop("queue")
        for name in LEASE_COLUMNS:  # a random uuid
            event[name] = event[name] is not None
        return event

    def schedule(
        self,
        on_conflict: str,
        item: dict[str, Any],
        *,
        now: datetime,
        debounce_max_seconds: float | None = None,
        traceparent: str | None = None,
        queue: str | None = None,
    ) -> Any:
        events = json.dumps([{"ord": 0, **item}])
        args: list[Any] = [queue or self.queue, events, "app", on_conflict, now, debounce_max_seconds]
        if traceparent is None:
            call = f"tickler_schedule{self.suffix}(%s, %s::jsonb, %s, %s, %s, %s, true)"
        else:
            call = f"tickler_schedule_traced{self.suffix}(%s, %s::jsonb, %s, %s, %s, %s, true, %s::jsonb)"
            args.append(json.dumps([{"traceparent": traceparent, "tracestate": "v=1"}]))
        try:
            rows = self.raw.execute(
                f"SELECT r.ord, r.item_key, r.outcome, r.id, to_jsonb(r.event) FROM {call} AS r",  # type: ignore[arg-type]
                args,
            ).fetchall()
        except psycopg.Error as error:
            message = str(error).splitlines()[0]
            # a constraint's message shows the failing row, whose id differs
            return ("error", error.sqlstate, None if (error.sqlstate or "").startswith("23") else message)
        return [(o, k, outcome, self.id(i), self.event(e)) for o, k, outcome, i, e in rows]

    def lease(self, item_key: str, *, expired: bool = False) -> None:
        expires = T0 + (timedelta(seconds=-1) if expired else timedelta(days=10))
        done = self.raw.execute(
            "UPDATE tickler_event SET claimed_on = %s, claimed_by = 'w', lease_id = gen_random_uuid(),"
            " lease_expires_on = %s WHERE queue = %s AND item_key = %s AND dequeued_on IS NULL",
            [T0 - timedelta(minutes=1), expires, self.queue, item_key],
        )
        assert done.rowcount == 1

    def state(self) -> dict[str, Any]:
        """Every event of the queue (open and finished), its timeline, counts and leases."""
        raw = self.raw
        events = raw.execute(
            "SELECT to_jsonb(e) FROM tickler_event_all AS e WHERE queue = %s ORDER BY id", [self.queue]
        ).fetchall()
        timeline = raw.execute(
            "SELECT item_key, event_id, at, action, actor, schedule_on, details FROM tickler_timeline"
            " WHERE queue = %s ORDER BY id",
            [self.queue],
        ).fetchall()
        counts = raw.execute(
            "SELECT state, sum(n) FROM tickler_queue_count WHERE queue = %s GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1",
            [self.queue],
        ).fetchall()
        leases = raw.execute("SELECT count(*) FROM tickler_lease WHERE queue = %s", [self.queue]).fetchone()
        return {
            "events": [self.event(e) for (e,) in events],
            "timeline": [(k, self.id(i), at, a, who, on, _unclaimed(d)) for k, i, at, a, who, on, d in timeline],
            "counts": counts,
            "leases": leases,
        }


def _unclaimed(details: Any) -> Any:
    """A timeline entry's details without the lease ids (random)."""
    if not isinstance(details, dict):
        return details
    return {k: (v is not None if k == "lease_id" else _unclaimed(v)) for k, v in details.items()}


def steps(side: Side) -> list[Any]:
    """The scenario, as one list of results."""
    at = [T0 + timedelta(seconds=10 * n) for n in range(40)]
    s = side.schedule
    out: list[Any] = []
    item_a = {"item_key": "a", "group_key": "g1", "schedule_on": "2030-01-01T10:00:00Z", "data": {"n": 1},
              "max_attempts": 5, "priority": 2, "fairness_key": "f1"}  # fmt: skip
    out.append(s("reject", item_a, now=at[0]))  # created
    out.append(s("reject", {"item_key": "a", "delay_seconds": 5}, now=at[1]))  # conflict
    out.append(s("ignore", {"item_key": "a"}, now=at[2]))  # conflict (ignored)
    out.append(s("ignore", {"item_key": "b", "delay_seconds": 60, "fairness_key": "fb"}, now=at[3]))  # created
    out.append(s("replace", {"item_key": "a", "data": {"n": 2}, "delay_seconds": 30}, now=at[4]))  # defaults
    out.append(s("replace", {"item_key": "c", "group_key": "g2", "priority": -1}, now=at[5]))  # created
    capped = {"item_key": "b", "delay_seconds": 600, "data": {"m": [1]}}
    out.append(s("debounce", capped, now=at[6], debounce_max_seconds=30))
    out.append(s("debounce", {"item_key": "b", "delay_seconds": 900, "priority": 3}, now=at[7]))  # no cap
    out.append(s("debounce", {"item_key": "c", "max_attempts": 2, "group_key": None}, now=at[8]))
    side.lease("c")
    out.append(s("replace", {"item_key": "c"}, now=at[9]))  # in flight
    out.append(s("debounce", {"item_key": "c"}, now=at[10]))  # in flight
    out.append(s("reject", {"item_key": "c"}, now=at[11]))  # conflict
    out.append(s("ignore", {"item_key": "c"}, now=at[12]))  # conflict (ignored)
    side.lease("a", expired=True)
    out.append(s("replace", {"item_key": "a", "data": {"n": 3}}, now=T0 + timedelta(hours=2)))  # lease ended first
    out.append(s("reject", {"item_key": "g", "max_attempts": 1, "schedule_on": "2029-12-31T00:00:00Z"}, now=at[13]))
    side.lease("g", expired=True)
    out.append(s("debounce", {"item_key": "g", "delay_seconds": 1}, now=T0 + timedelta(hours=3)))  # dead, then new
    out.append(s("reject", {"item_key": "d", "delay_seconds": 10}, now=at[14], traceparent=TRACE_1))
    out.append(s("replace", {"item_key": "d", "delay_seconds": 20}, now=at[15], traceparent=TRACE_2))
    out.append(s("ignore", {"item_key": "d"}, now=at[16], traceparent=TRACE_1))  # refused: trace not kept
    out.append(s("debounce", {"item_key": "e", "schedule_on": "2030-01-02T00:00:00+02:00"}, now=at[17]))
    out.append(s("debounce", {"item_key": "e", "group_key": "g3"}, now=at[18], debounce_max_seconds=0))
    # errors: an unknown mode, an unknown queue, an item without a key, a max_attempts out of range
    out.append(s("sometimes", {"item_key": "x"}, now=at[19]))
    out.append(s("reject", {"item_key": "x"}, now=at[20], queue="no_such_queue"))
    out.append(s("reject", {"delay_seconds": 1}, now=at[21]))
    out.append(s("reject", {"item_key": "y", "max_attempts": 0}, now=at[22]))
    out.append(s("reject", {"item_key": "z", "priority": 99999}, now=at[23]))
    return out


TRACE_1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_one_event_writes_what_the_general_path_writes(
    raw: psycopg.Connection[Any], make_queue: Callable[..., Queue], general: None
) -> None:
    for name in (SINGLE, GENERAL):
        make_queue(name, max_attempts=4)
    single, general_side = Side(raw, SINGLE, ""), Side(raw, GENERAL, "_general")
    got, wanted = steps(single), steps(general_side)
    assert [r if isinstance(r, tuple) else [x[2] for x in r] for r in got][:5] == [
        ["created"],
        ["conflict"],
        ["conflict"],
        ["created"],
        ["replaced"],
    ]
    for n, (one, other) in enumerate(zip(got, wanted, strict=True)):
        assert one == other, f"step {n}"
    mine, theirs = single.state(), general_side.state()
    for name in mine:
        assert len(mine[name]) == len(theirs[name]), name
        for n, (one, other) in enumerate(zip(mine[name], theirs[name], strict=True)):
            assert one == other, f"{name} {n}"
    outcomes = {x[2] for r in got if isinstance(r, list) for x in r}
    assert outcomes == {"created", "conflict", "replaced", "debounced", "in_flight"}
    assert [n for n, r in enumerate(got) if isinstance(r, tuple)] == [21, 22, 23, 24, 25], got


def test_the_general_path_of_0064_is_0061s() -> None:
    """0064 adds a branch and its variables; what runs for two events or more is 0061's text."""
    header = "CREATE OR REPLACE FUNCTION tickler_schedule_write("
    new = function_text("0064_schedule_one.sql", header)
    start = new.index("    -- One event (a single-event request")
    end = new.index("    -- One aggregate over one scan")
    new = new[:start] + new[end:]
    new = re.sub(r"    -- one event \(the single-event branch\).*?\n(    o_.*\n)+", "", new)
    assert new == function_text("0061_timeline_one_place.sql", header)
