"""Large batches by COPY into a staging table (tickler_schedule_staged, migration 0066) against the
jsonb path (tickler_schedule, one jsonb parameter).

The same batches run on two queues, one through each path (EventStore.schedule_batch with and
without copy_min_events). Results, events (versions, times, lease ends), timeline entries, counts
and errors must be the same: every on_conflict mode, debounce with and without a cap, groups,
priority and fairness keys, conflicts, duplicates within a batch, in-flight events, an expired
lease the call ends first, and a batch that fails as a whole. Then the HTTP answer: the same body
either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask

from tests.test_schedule_single import Side
from tickler.api import close_app, create_app
from tickler.api.metrics import EVENTS_SCHEDULED
from tickler.config import Settings
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
STAGED, JSONB = "staged_path", "jsonb_path"
OUTCOMES = ("created", "rejected", "ignored", "replaced", "debounced")


class Path:
    """One queue and the path that writes it."""

    def __init__(self, store: Store, raw: psycopg.Connection[Any], queue: Queue, copy_min_events: int) -> None:
        self.store, self.queue, self.copy_min_events = store, queue, copy_min_events
        self.side = Side(raw, queue.name, "")

    def batch(
        self,
        on_conflict: str,
        items: list[dict[str, Any]],
        *,
        now: datetime,
        debounce_max_seconds: float | None = None,
        queue: Queue | None = None,
    ) -> Any:
        events = [NewEvent(**{"data": {}, **item}) for item in items]
        try:
            results = self.store.events.schedule_batch(
                queue or self.queue,
                events,
                actor="app",
                on_conflict=on_conflict,
                now=now,
                debounce_max_seconds=debounce_max_seconds,
                copy_min_events=self.copy_min_events,
            )
        except sa.exc.DBAPIError as error:
            orig = error.orig
            assert isinstance(orig, psycopg.Error)
            message = str(orig).splitlines()[0]
            # a constraint's message shows the failing row, whose id differs
            return ("error", type(error).__name__, orig.sqlstate, None if orig.sqlstate.startswith("23") else message)
        return [(r.item_key, r.outcome, self.side.id(r.id)) for r in results]


def steps(path: Path, other_queue: Queue) -> list[Any]:
    at = [T0 + timedelta(seconds=10 * n) for n in range(40)]
    b = path.batch
    out: list[Any] = []
    item_a = {
        "item_key": "a",
        "group_key": "g1",
        "schedule_on": datetime(2030, 1, 1, 10, tzinfo=UTC),
        "data": {"n": 1, "text": 'tab\there \\ "q" é \u2028'},
        "max_attempts": 5,
        "priority": 2,
        "fairness_key": "f1",
    }
    out.append(
        b("reject", [item_a, {"item_key": "b", "delay_seconds": 60}, {"item_key": "c", "group_key": "g2"}], now=at[0])
    )
    out.append(b("reject", [{"item_key": "a", "delay_seconds": 5}, {"item_key": "d", "delay_seconds": 1.5}], now=at[1]))
    out.append(
        b("ignore", [{"item_key": "a"}, {"item_key": "e", "fairness_key": "fe", "data": {"big": 2**70}}], now=at[2])
    )
    out.append(
        b(
            "replace",
            [
                {"item_key": "a", "data": {"n": 2}, "delay_seconds": 30},
                {"item_key": "f", "group_key": "g2", "priority": -1},
                {"item_key": "b"},
            ],
            now=at[3],
        )
    )
    out.append(
        b(
            "debounce",
            [
                {"item_key": "b", "delay_seconds": 600, "data": {"m": [1]}},
                {"item_key": "c", "max_attempts": 2},
                {"item_key": "g", "delay_seconds": 5},
            ],
            now=at[4],
            debounce_max_seconds=30,
        )
    )
    out.append(b("debounce", [{"item_key": "b", "delay_seconds": 900, "priority": 3}, {"item_key": "d"}], now=at[5]))
    path.side.lease("c")
    out.append(b("replace", [{"item_key": "c"}, {"item_key": "d", "delay_seconds": 7}], now=at[6]))  # in flight
    out.append(b("debounce", [{"item_key": "c"}, {"item_key": "h"}], now=at[7]))  # in flight
    out.append(b("reject", [{"item_key": "c"}, {"item_key": "i"}], now=at[8]))
    path.side.lease("a", expired=True)
    out.append(b("replace", [{"item_key": "a", "data": {"n": 3}}, {"item_key": "j"}], now=T0 + timedelta(hours=2)))
    # duplicates within one batch (the API refuses them; the function's answer is the same either way)
    out.append(b("reject", [{"item_key": "k", "data": {"n": 1}}, {"item_key": "k", "data": {"n": 2}}], now=at[9]))
    out.append(b("ignore", [{"item_key": "l"}, {"item_key": "l", "delay_seconds": 9}], now=at[10]))
    out.append(b("replace", [{"item_key": "k", "data": {"n": 3}}, {"item_key": "k", "data": {"n": 4}}], now=at[11]))
    out.append(b("debounce", [{"item_key": "m"}, {"item_key": "m", "delay_seconds": 3}], now=at[12]))
    # a larger batch: new keys, taken keys, groups
    many = [
        {"item_key": f"n{i}", "group_key": f"g{i % 7}" if i % 3 else None, "delay_seconds": i, "data": {"i": i}}
        for i in range(250)
    ]
    out.append(b("reject", many[:200], now=at[13]))
    out.append(b("ignore", many[150:], now=at[14]))
    out.append(b("debounce", many[::2], now=at[15], debounce_max_seconds=100))
    out.append(b("replace", [*many[::3], {"item_key": "a"}, {"item_key": "c"}], now=at[16]))
    # a batch that fails as a whole (nothing of it is written), an unknown queue, an unknown mode
    out.append(b("reject", [{"item_key": "o1"}, {"item_key": "o2", "max_attempts": 0}], now=at[17]))
    out.append(b("reject", [{"item_key": "p1"}, {"item_key": "p2", "priority": 99999}], now=at[18]))
    out.append(b("reject", [{"item_key": "q1"}, {"item_key": None}], now=at[19]))
    out.append(b("reject", [{"item_key": "r1"}, {"item_key": "r2"}], now=at[20], queue=other_queue))
    out.append(b("sometimes", [{"item_key": "s1"}, {"item_key": "s2"}], now=at[21]))
    return out


def test_a_staged_batch_writes_what_the_jsonb_path_writes(
    store: Store, raw: psycopg.Connection[Any], make_queue: Callable[..., Queue]
) -> None:
    staged = Path(store, raw, make_queue(STAGED, max_attempts=4), copy_min_events=1)
    jsonb = Path(store, raw, make_queue(JSONB, max_attempts=4), copy_min_events=0)
    missing = replace(staged.queue, name="no_such_queue")
    got, wanted = steps(staged, missing), steps(jsonb, missing)
    assert [x[1] for x in got[0]] == ["created"] * 3
    for n, (one, other) in enumerate(zip(got, wanted, strict=True)):
        assert one == other, f"step {n}"
    mine, theirs = staged.side.state(), jsonb.side.state()
    for state in (mine, theirs):  # the order of one statement's entries is the plan's (each queue its own)
        state["timeline"].sort(key=lambda entry: (entry[2], entry[0], entry[3], entry[1]))
    for name in mine:
        assert len(mine[name]) == len(theirs[name]), name
        for n, (one, other) in enumerate(zip(mine[name], theirs[name], strict=True)):
            assert one == other, f"{name} {n}"
    outcomes = {x[1] for r in got if isinstance(r, list) for x in r}
    assert outcomes == {"created", "rejected", "ignored", "replaced", "debounced"}
    errors = [n for n, r in enumerate(got) if isinstance(r, tuple)]
    # a key twice in one batch: its second item is never settled (both paths: the function's answer)
    assert [got[n][3] for n in errors[:4]] == ["tickler_schedule: keys kept changing state"] * 4
    assert errors == [10, 11, 12, 13, *range(len(got) - 5, len(got))], got
    # a batch that failed wrote nothing
    assert raw.execute("SELECT count(*) FROM tickler_event WHERE item_key IN ('o1', 'p1', 'q1')").fetchone() == (0,)


def test_the_staged_path_runs_on_a_pooled_connection_again_and_after_a_failure(
    store: Store, make_queue: Callable[..., Queue]
) -> None:
    queue = make_queue("again")
    for round_ in range(4):  # the pool (5) hands out the same connections: the table is there, empty
        events = [NewEvent(f"k{round_}-{i}", {"i": i}, delay_seconds=60) for i in range(300)]
        if round_ == 2:
            events.append(NewEvent("bad", {}, max_attempts=0))
            with pytest.raises(sa.exc.IntegrityError):
                store.events.schedule_batch(queue, events, actor="app", copy_min_events=200)
            continue
        results = store.events.schedule_batch(queue, events, actor="app", copy_min_events=200)
        assert [r.outcome for r in results] == ["created"] * 300
        assert [r.item_key for r in results] == [e.item_key for e in events]
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM tickler_event WHERE queue = 'again'")).scalar() == 900


@pytest.fixture
def copy_app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings.with_overrides(batch_copy_min_events=1), configure_logs=False)
    yield app
    close_app(app)


def test_the_http_answer_is_the_same_either_way(
    app: Flask, copy_app: Flask, admin_token: str, make_queue: Callable[..., Queue]
) -> None:
    headers = {"Authorization": f"Bearer {admin_token}"}
    make_queue("http_a")
    make_queue("http_b")
    # keys with what JSON escapes (a quote, a backslash) and what it leaves as is (é, ☃)
    keys = ["k0", 'k"1', "k\\2", "ké3", "k☃4", "k5"]
    items = [{"item_key": key, "delay_seconds": 60, "data": {"i": i, "s": "é\n"}} for i, key in enumerate(keys)]
    bodies, types, counted = {}, {}, {}
    for name, flask_app, queue in (("jsonb", app, "http_a"), ("staged", copy_app, "http_b")):
        client = flask_app.test_client()
        answers = []
        before = {o: EVENTS_SCHEDULED.labels(queue, o)._value.get() for o in OUTCOMES}
        for on_conflict, events in (
            ("reject", items[:3]),
            ("reject", items),
            ("ignore", items),
            ("replace", items),
            ("debounce", items[2:]),
        ):
            response = client.post(
                f"/v1/queues/{queue}/events/batch", json={"events": events, "on_conflict": on_conflict}, headers=headers
            )
            assert response.status_code == 200, response.get_data(as_text=True)
            answers.append(response.get_data())
            types[name] = response.headers["Content-Type"]
        bodies[name] = answers
        counted[name] = {o: EVENTS_SCHEDULED.labels(queue, o)._value.get() - before[o] for o in OUTCOMES}
    assert types["jsonb"] == types["staged"] == "application/json"
    assert counted["jsonb"] == counted["staged"]
    assert counted["staged"] == {"created": 6, "rejected": 3, "ignored": 6, "replaced": 6, "debounced": 4}
    # the ids are the only difference: each queue's events are numbered from its own first id
    for one, other in zip(bodies["jsonb"], bodies["staged"], strict=True):
        assert relative_ids(other, bodies["staged"][0]) == relative_ids(one, bodies["jsonb"][0])


def relative_ids(body: bytes, first_body: bytes) -> bytes:
    first = int(re.search(rb'"id":(\d+)', first_body)[1])  # type: ignore[index]
    return re.sub(rb'"id":(\d+)', lambda m: b'"id":%d' % (int(m[1]) - first), body)
